//! goose on-sale scenarios (20,000 fans through queue, seat map, hold and checkout). Not built yet: the
//! scenario arrives with the load-test issue; `booking bench` measures holds and checkouts meanwhile.

fn main() {
    eprintln!("loadtest: not implemented yet; see `booking bench` in README.md");
    std::process::exit(2);
}
