//! The framework's floor: a pingora `ProxyHttp` that only forwards every request to one booking node, with
//! the gateway's runtime settings (two worker threads, mimalloc) and nothing of its own. `deploy/bench-gateway`
//! runs it beside the gateway, so what the gateway costs on top of pingora is measured in the same run.
//!
//!     cargo run --release -p gateway --example floor -- 127.0.0.1:18010 127.0.0.1:18080
//!     curl http://127.0.0.1:18010/healthz
//!
//! The upstream may also be `unix:/path/to/booking.sock`. With `--timeouts`, it keeps the three timeouts the
//! gateway's contract needs and nothing else of the gateway: a client's idle connection closes after 60 s,
//! each read of booking's answer waits at most 10 s, and each write to the client at most 10 s (each costs a
//! timer per request).

use async_trait::async_trait;
use pingora::modules::http::HttpModules;
use pingora::proxy::{ProxyHttp, Session};
use pingora::server::Server;
use pingora::server::configuration::ServerConf;
use pingora::upstreams::peer::HttpPeer;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Forwards everything to one prepared peer.
struct Floor {
    peer: HttpPeer,
    /// The client's idle limit between requests, in seconds.
    keepalive: Option<u64>,
    /// The longest a write to the client may make no progress.
    write_timeout: Option<std::time::Duration>,
}

#[async_trait]
impl ProxyHttp for Floor {
    type CTX = ();

    fn new_ctx(&self) {}

    // No downstream module (pingora adds a switched-off compression module by default), as in the gateway.
    fn init_downstream_modules(&self, _modules: &mut HttpModules) {}

    async fn early_request_filter(&self, session: &mut Session, _ctx: &mut ()) -> pingora::Result<()> {
        if self.keepalive.is_some() && session.get_keepalive() == Some(0) {
            session.set_keepalive(self.keepalive);
        }
        if self.write_timeout.is_some() {
            session.set_write_timeout(self.write_timeout);
        }
        Ok(())
    }

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> pingora::Result<Box<HttpPeer>> {
        Ok(Box::new(self.peer.clone()))
    }
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: floor LISTEN_ADDR UPSTREAM (host:port or unix:/path) [--timeouts]");
    };
    let timeouts = args.next().as_deref() == Some("--timeouts");
    let mut peer = match upstream.strip_prefix("unix:") {
        Some(path) => HttpPeer::new_uds(path, false, String::new()).map_err(|e| anyhow::anyhow!("{e}"))?,
        None => HttpPeer::new(upstream.parse::<std::net::SocketAddr>()?, false, String::new()),
    };
    if timeouts {
        peer.options.read_timeout = Some(std::time::Duration::from_secs(10));
    }
    let ten = std::time::Duration::from_secs(10);
    let floor = Floor { peer, keepalive: timeouts.then_some(60), write_timeout: timeouts.then_some(ten) };
    let conf = ServerConf { threads: 2, work_stealing: true, grace_period_seconds: Some(0), ..ServerConf::default() };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut proxy = pingora::proxy::http_proxy_service(&server.configuration, floor);
    proxy.add_tcp(&listen);
    server.add_service(proxy);
    server.run_forever()
}
