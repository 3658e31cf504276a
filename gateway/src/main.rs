//! The waiting-room gateway. Not built yet: the pingora server (queue, admission, rate limits, admin API)
//! arrives with its own issue. Until then booking is reached directly, with admission proofs minted by
//! `booking token admission`.

fn main() {
    eprintln!("gateway: not implemented yet; call booking directly (see README.md)");
    std::process::exit(2);
}
