//! A TCP forwarder that can be made slow while it runs: the chaos drill's slow links, on kernels without netem.
//!
//! `slowlink --listen 10.203.0.1:16379 --to 127.0.0.1:16379 --delay-file /path/r.delay` forwards every
//! connection it accepts to `--to`. Each piece of data, either way, leaves the forwarder the delay after it came
//! in, so a delay of D adds 2·D to every round trip and nothing to the throughput: pieces in flight overlap, as
//! packets do on a long link. The delay is the whole number of milliseconds in the delay file, read every 50 ms
//! (no file, or no number in it: none), so a drill slows a link and heals it without cutting a connection. The
//! word `dark` in the file holds every piece until it changes, as a partition holds packets that TCP sends again
//! once it heals: connections stay open and carry nothing. Killing the process cuts every connection it carries.

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use clap::Parser;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream, tcp::OwnedReadHalf, tcp::OwnedWriteHalf},
    sync::mpsc,
    time::Instant,
};

#[derive(Parser)]
#[command(about = "A TCP forwarder whose delay a file sets while it runs")]
struct Args {
    /// Where to accept connections.
    #[arg(long)]
    listen: String,
    /// Where to forward each one.
    #[arg(long)]
    to: String,
    /// A file holding the delay each way, in whole milliseconds (absent: none), or `dark`.
    #[arg(long)]
    delay_file: PathBuf,
}

/// Pieces one direction may have in flight; a reader waits for room beyond that (a slow link's window).
const IN_FLIGHT: usize = 1024;
/// The most one read takes in.
const PIECE: usize = 64 * 1024;
/// The delay that means a dark link.
const DARK: u64 = u64::MAX;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let listener = TcpListener::bind(&args.listen).await?;
    let delay_ms = Arc::new(AtomicU64::new(read_delay(&args.delay_file)));
    tokio::spawn(follow_delay(args.delay_file.clone(), delay_ms.clone()));
    loop {
        let (inbound, _) = listener.accept().await?;
        let (to, delay_ms) = (args.to.clone(), delay_ms.clone());
        tokio::spawn(async move {
            // A target that refuses is a connection closed at once, as a forwarder without one behaves.
            let Ok(outbound) = TcpStream::connect(&to).await else { return };
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            let (in_read, in_write) = inbound.into_split();
            let (out_read, out_write) = outbound.into_split();
            tokio::join!(pump(in_read, out_write, delay_ms.clone()), pump(out_read, in_write, delay_ms));
        });
    }
}

/// The delay in the file, in ms ([`DARK`] for `dark`); 0 without one. (A few bytes, read in passing: no
/// blocking worth a thread.)
fn read_delay(file: &PathBuf) -> u64 {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    if text.trim() == "dark" { DARK } else { text.trim().parse().unwrap_or(0) }
}

async fn follow_delay(file: PathBuf, delay_ms: Arc<AtomicU64>) {
    let mut every = tokio::time::interval(Duration::from_millis(50));
    loop {
        every.tick().await;
        delay_ms.store(read_delay(&file), Ordering::Relaxed);
    }
}

/// Carries one direction: each piece read is written the delay later, in order (the delay in force when it is
/// due to go, so a link that heals lets what it held go at once). The far side's write half is shut once the
/// near side has said it is done and everything before has gone out.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay_ms: Arc<AtomicU64>) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(IN_FLIGHT);
    let reader = async move {
        let mut buf = vec![0; PIECE];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.send((Instant::now(), buf[..n].to_vec())).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    let writer = async move {
        while let Some((read_at, piece)) = rx.recv().await {
            loop {
                let delay = delay_ms.load(Ordering::Relaxed);
                if delay == DARK {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                let due = read_at + Duration::from_millis(delay);
                // Not through the timer when due (its tick is a millisecond): a link without delay adds none.
                if due <= Instant::now() {
                    break;
                }
                // Woken at least every 50 ms, to follow a change of the delay.
                tokio::time::sleep_until(due.min(Instant::now() + Duration::from_millis(50))).await;
            }
            if to.write_all(&piece).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}
