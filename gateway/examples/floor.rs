//! The framework's floor: a pingora `ProxyHttp` that only forwards every request to one booking node, with
//! the gateway's runtime settings (two worker threads, mimalloc) and nothing of its own. `deploy/bench-gateway`
//! runs it beside the gateway, so what the gateway costs on top of pingora is measured in the same run.
//!
//!     cargo run --release -p gateway --example floor -- 127.0.0.1:18010 127.0.0.1:18080
//!     curl http://127.0.0.1:18010/healthz
//!
//! The upstream may also be `unix:/path/to/booking.sock`.

use async_trait::async_trait;
use pingora::proxy::{ProxyHttp, Session};
use pingora::server::Server;
use pingora::server::configuration::ServerConf;
use pingora::upstreams::peer::HttpPeer;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Forwards everything to one prepared peer.
struct Floor(HttpPeer);

#[async_trait]
impl ProxyHttp for Floor {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> pingora::Result<Box<HttpPeer>> {
        Ok(Box::new(self.0.clone()))
    }
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: floor LISTEN_ADDR UPSTREAM (host:port or unix:/path)");
    };
    let peer = match upstream.strip_prefix("unix:") {
        Some(path) => HttpPeer::new_uds(path, false, String::new()).map_err(|e| anyhow::anyhow!("{e}"))?,
        None => HttpPeer::new(upstream.parse::<std::net::SocketAddr>()?, false, String::new()),
    };
    let conf = ServerConf { threads: 2, work_stealing: true, grace_period_seconds: Some(0), ..ServerConf::default() };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut proxy = pingora::proxy::http_proxy_service(&server.configuration, Floor(peer));
    proxy.add_tcp(&listen);
    server.add_service(proxy);
    server.run_forever()
}
