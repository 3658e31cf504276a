"""What hostile requests cost a gateway binary, measured from outside (deploy/hostile-probe runs it).

Starts the gateway given on scratch ports, on the stack's Redis under a scratch key prefix, in front of an upstream
of its own that answers a seat map as large as a 20,000-seat event's, and measures three attacks:

1. catch-up: 40 anonymous `GET /events/{id}/seats/stream?since=0` in turn on a log of 50,000 entries (what a
   20,000-seat on-sale reaches): bytes sent, the gateway's CPU (to a clock tick over the 40) and the XRANGE
   calls per request, and the gateway's memory with 20 such clients that never read;
2. streams: how many live streams 8 client addresses hold open at once (each trying 400);
3. never-reading clients: three forwarded 4 MB answers to clients with a tiny receive window that never read,
   and how many connections to the upstream they still pin after 15 and 30 seconds.

Every loop is bounded in count and time, and everything targets loopback only.
"""

import http.server
import json
import os
import secrets
import socket
import socketserver
import subprocess
import sys
import threading
import time
import urllib.request

GATEWAY_BIN = sys.argv[1]
BOOKING_BIN = sys.argv[2]
PORT, ADMIN, UPSTREAM = 18400, 18401, 18402
EVENT = 1
PREFIX = f"probe-{secrets.token_hex(4)}:"
ADMIN_TOKEN = "hostile-probe-admin-token-0001"
KEYS = "p1:hostile-probe-admission-key-000000001"
LOG_ENTRIES = 50_000
BODY = 4 * 1024 * 1024
REDIS_URL = os.environ["REDIS_URL"]
# redis://:password@host:port/ as the stack writes it; redis-cli takes the password from REDISCLI_AUTH.
_REDIS_PASSWORD, _REDIS_ADDR = REDIS_URL.split("://", 1)[1].rstrip("/").rsplit("@", 1)
_REDIS_HOST, _REDIS_PORT = _REDIS_ADDR.rsplit(":", 1)


def redis(*args):
    env = dict(os.environ, REDISCLI_AUTH=_REDIS_PASSWORD.lstrip(":"))
    out = subprocess.run(["redis-cli", "-h", _REDIS_HOST, "-p", _REDIS_PORT, *args],
                         check=True, capture_output=True, text=True, env=env).stdout.strip()
    if out.startswith(("ERR", "NOAUTH", "WRONGPASS")):
        raise RuntimeError(f"redis-cli {args[0]}: {out}")
    return out


class Upstream(http.server.BaseHTTPRequestHandler):
    """Booking's stand-in: a 4 MB answer to anything but `/readyz`, and a count of connections in use."""
    protocol_version = "HTTP/1.1"
    busy = 0
    lock = threading.Lock()

    def log_message(self, *_):
        pass

    def do_GET(self):
        if self.path == "/readyz" or self.path.endswith("/availability"):
            body = b'{"status":"ready","sold_out":false,"seats_available":100}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        with Upstream.lock:
            Upstream.busy += 1
        try:
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(BODY))
            self.end_headers()
            piece = b" " * 65536
            for _ in range(BODY // len(piece)):
                self.wfile.write(piece)
        except OSError:
            pass
        finally:
            with Upstream.lock:
                Upstream.busy -= 1


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        pass  # a connection the gateway gave up on: what the probe is measuring


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def xrange_calls():
    for line in redis("INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_xrange:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


def held_by_gateway(peers):
    """Client connections from `peers` (an address prefix) the gateway's process still holds open."""
    out = subprocess.run(["ss", "-Htn", "state", "established", f"( sport = :{PORT} )"],
                         capture_output=True, text=True).stdout
    return sum(1 for line in out.splitlines() if line.split()[-1].startswith(peers))


def raw_get(path, source="127.0.0.1", headers="", recv_buffer=None):
    s = socket.socket()
    if recv_buffer:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, recv_buffer)
    s.bind((source, 0))
    s.settimeout(5)
    s.connect(("127.0.0.1", PORT))
    s.sendall(f"GET {path} HTTP/1.1\r\nhost: probe\r\naccept: text/event-stream\r\n{headers}\r\n".encode())
    return s


def read_all(s, quiet=1.0, limit=30.0):
    """Reads until the connection ends, or nothing came for `quiet` seconds after something did."""
    total, started = 0, time.monotonic()
    s.settimeout(quiet)
    while time.monotonic() - started < limit:
        try:
            chunk = s.recv(1 << 16)
        except socket.timeout:
            if total:
                break
            continue
        except OSError:
            break
        if not chunk:
            break
        total += len(chunk)
    s.close()
    return total


def seed_log():
    keys = [f"{PREFIX}seatmap:{{ev{EVENT}}}:log", f"{PREFIX}seatmap:{{ev{EVENT}}}:version"]
    script = """
    local v = tonumber(ARGV[1])
    for i = 1, tonumber(ARGV[2]) do
      local s = (i * 7) % 20000
      local c = string.format('%d:h,%d:h,%d:h,%d:h,%d:h', s, s + 1, s + 2, s + 3, s + 4)
      redis.call('XADD', KEYS[1], string.format('%d-0', v + i), 'c', c, 't', 1700000000000 + i)
    end
    redis.call('SET', KEYS[2], string.format('%d', v + tonumber(ARGV[2])))
    return v + tonumber(ARGV[2])
    """
    first = 1_700_000_000_000_000
    redis("EVAL", script, "2", *keys, str(first), str(LOG_ENTRIES))


def main():
    upstream = Server(("127.0.0.1", UPSTREAM), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update({
        "GATEWAY_LISTEN": f"127.0.0.1:{PORT}", "GATEWAY_ADMIN_LISTEN": f"127.0.0.1:{ADMIN}",
        "BOOKING_UPSTREAMS": f"127.0.0.1:{UPSTREAM}", "GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN,
        "ADMISSION_KEYS": KEYS, "ACCOUNT_KEYS": KEYS, "REDIS_KEY_PREFIX": PREFIX,
        # The attacks below are about what each request holds, not how many a second: the rate limit aside.
        "GATEWAY_IP_RPS": "100000", "GATEWAY_IP_BURST": "100000", "GATEWAY_GRACE_SECONDS": "0",
        "RUST_LOG": "error",
    })
    gw = subprocess.Popen([GATEWAY_BIN, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", PORT), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        req = urllib.request.Request(f"http://127.0.0.1:{ADMIN}/admin/events/{EVENT}", method="PUT",
                                     data=json.dumps({"state": "open"}).encode(),
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}",
                                              "content-type": "application/json"})
        urllib.request.urlopen(req, timeout=5).read()
        time.sleep(1.5)
        seed_log()
        rows = []

        # 1. A replay of the whole log to an anonymous client.
        n = 40
        # The gateway's own reads of the log while idle (its feed checks where the log ends), taken out below.
        calls, started = xrange_calls(), time.monotonic()
        time.sleep(3)
        idle_rate = (xrange_calls() - calls) / (time.monotonic() - started)
        ticks, calls, started = cpu_ticks(gw.pid), xrange_calls(), time.monotonic()
        sizes = [read_all(raw_get(f"/events/{EVENT}/seats/stream?since=0")) for _ in range(n)]
        cpu_ms = (cpu_ticks(gw.pid) - ticks) * 1000 / os.sysconf("SC_CLK_TCK") / n
        own = xrange_calls() - calls - idle_rate * (time.monotonic() - started)
        rows.append(("catch-up: bytes sent per `?since=0` (head and body)", f"{sum(sizes) / n:,.0f}"))
        tick_ms = 1000 / os.sysconf("SC_CLK_TCK") / n
        rows.append(("catch-up: gateway CPU per request", f"{cpu_ms:.2f} ms (±{tick_ms:.2f})"))
        rows.append(("catch-up: XRANGE calls per request", f"{max(own, 0) / n:.1f}"))
        before = rss_mb(gw.pid)
        idle = [raw_get(f"/events/{EVENT}/seats/stream?since=0", recv_buffer=4096) for _ in range(20)]
        time.sleep(5)
        rows.append(("catch-up: gateway RSS, 20 clients that never read", f"{before:.0f} -> {rss_mb(gw.pid):.0f} MB"))
        for s in idle:
            s.close()
        time.sleep(1)

        # 2. Streams held open from 8 addresses, 400 tries each.
        held, refused = [], 0
        for a in range(8):
            for _ in range(400):
                try:
                    s = raw_get(f"/events/{EVENT}/seats/stream", source=f"127.0.1.{a + 1}")
                    head = s.recv(64)
                except OSError:
                    refused += 1
                    continue
                if head.startswith(b"HTTP/1.1 200"):
                    held.append(s)
                else:
                    refused += 1
                    s.close()
        rows.append(("streams: held open by 8 addresses (400 tries each)", f"{len(held)} ({len(held) / 8:.0f} each)"))
        for s in held:
            s.close()
        time.sleep(1)

        # 3. Forwarded answers to clients that never read.
        proof = subprocess.run([BOOKING_BIN, "token", "admission", "--account", "probe-1", "--event", str(EVENT),
                                "--ttl-seconds", "600", "--keys", KEYS], check=True, capture_output=True,
                               text=True).stdout.strip()
        stuck = [raw_get(f"/events/{EVENT}/seats", source=f"127.0.2.{k + 1}",
                         headers=f"authorization: Bearer {proof}\r\n", recv_buffer=4096) for k in range(3)]
        pinned, held = [], []
        for wait in (15, 15):
            time.sleep(wait)
            pinned.append(Upstream.busy)
            held.append(held_by_gateway("127.0.2."))
        rows.append(("never-reading clients: their connections the gateway holds after 15 s / 30 s",
                     f"{held[0]} / {held[1]} of 3"))
        rows.append(("never-reading clients: upstream answers still being written after 15 s / 30 s",
                     f"{pinned[0]} / {pinned[1]} of 3"))
        for s in stuck:
            s.close()

        width = max(len(r[0]) for r in rows)
        print(f"{'what':<{width}}  figure")
        for what, figure in rows:
            print(f"{what:<{width}}  {figure}")
    finally:
        gw.send_signal(2)
        gw.wait(timeout=10)
        upstream.shutdown()
        keys = redis("--scan", "--pattern", f"{PREFIX}*").split()
        if keys:
            redis("UNLINK", *keys)


if __name__ == "__main__":
    main()
