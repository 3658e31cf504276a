//! Gateway integration tests: the real `gateway` binary (pingora) on loopback ports, in front of a real HTTP
//! upstream that counts what reaches it, against the real Redis of the local stack.

mod adaptive;
mod codes;
mod edge;
mod freed;
mod gate;
mod harness;
mod limits;
mod proxy;
mod queue;
mod queueing;
mod replication;
mod resharding;
mod retire;
mod schedule;
mod seatmap;
