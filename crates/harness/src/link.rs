//! The drafters as a separate host: another network namespace, and a
//! round-trip time added between them and the rest of the mesh.
//!
//! The design puts drafter pods on their own (cheaper) machines, so every
//! tree crosses a network. To measure that on one machine, the launcher can
//! start the drafters in a network namespace of their own (`ip netns exec`;
//! `tools/bench/netns.sh` makes it and the launcher's, joined by a veth
//! pair) and put a [`DelayProxy`] in front of each:
//! verifiers and gateway dial the proxy, which forwards every byte to the
//! drafter after half the round trip, and every byte back after the other
//! half.
//!
//! This kernel has no `netem` qdisc, so the delay is ours. It is a proxy
//! rather than an NFQUEUE delayer so that it needs no privileges and no
//! Python, and works on loopback alone too. It runs on plain threads and
//! sleeps with `std::thread::sleep` (nanosleep) rather than tokio's timer,
//! whose 1 ms granularity would round a 0.5 ms half-trip up to 1 ms or 2.
//! Chunks keep their order and the link its bandwidth: each chunk is held
//! for the one-way delay from when it was read, not from when the one
//! before it left.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// How the drafters are reached: `--drafter-netns`, `--drafter-host`,
/// `--drafter-rtt-ms` of `specmesh up` and `specmesh bench --up`.
#[derive(clap::Args, Debug, Clone, Default, PartialEq)]
pub struct LinkArgs {
    /// Start the drafters in this network namespace (`ip netns exec NS`;
    /// needs root), as a separate host would be: `tools/bench/netns.sh up`
    /// makes `specmesh-d` for them and `specmesh-v` for the rest (run the
    /// launcher in it), joined by a veth pair. Give the drafters' address
    /// in it with --drafter-host.
    #[arg(long, requires = "drafter_host")]
    pub drafter_netns: Option<String>,
    /// The address the drafters listen on (default 127.0.0.1): in
    /// --drafter-netns, that namespace's veth address.
    #[arg(long)]
    pub drafter_host: Option<IpAddr>,
    /// Add this round-trip time, in milliseconds, between the drafters and
    /// the verifiers and gateway (a delay proxy in front of each drafter,
    /// half the delay each way).
    #[arg(long)]
    pub drafter_rtt_ms: Option<f64>,
}

impl LinkArgs {
    /// The drafters' listen address.
    pub fn host(&self) -> IpAddr {
        self.drafter_host.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// The added round trip, when a proxy is to be put in front of the
    /// drafters: one is whenever a round trip is asked for, and whenever
    /// the drafters run in another namespace (the mesh dials them through
    /// it, so that their address is loopback on this side, as on a host
    /// behind a Service).
    pub fn proxy_rtt(&self) -> anyhow::Result<Option<Duration>> {
        match self.drafter_rtt_ms {
            Some(ms) if !(ms.is_finite() && (0.0..=10_000.0).contains(&ms)) => {
                anyhow::bail!("`--drafter-rtt-ms {ms}`: give milliseconds between 0 and 10000")
            }
            Some(ms) => Ok(Some(Duration::from_secs_f64(ms / 1e3))),
            None if self.drafter_netns.is_some() => Ok(Some(Duration::ZERO)),
            None => Ok(None),
        }
    }
}

/// A TCP proxy adding a fixed round trip; see the module docs. Stops
/// accepting when dropped (connections already open run until either side
/// closes).
#[derive(Debug)]
pub struct DelayProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    rtt: Duration,
    stop: Arc<AtomicBool>,
}

/// Bytes read at once; a gRPC frame larger than this crosses in pieces,
/// each delayed alike.
const CHUNK: usize = 64 * 1024;

impl DelayProxy {
    /// Listens on `listen` (port 0: a free one) and forwards each
    /// connection to `upstream`, adding `rtt` to every round trip.
    pub fn start(
        listen: SocketAddr,
        upstream: SocketAddr,
        rtt: Duration,
    ) -> io::Result<DelayProxy> {
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let one_way = rtt / 2;
        let stopping = Arc::clone(&stop);
        thread::Builder::new()
            .name(format!("delay-proxy-{}", addr.port()))
            .spawn(move || {
                for conn in listener.incoming() {
                    if stopping.load(Ordering::Relaxed) {
                        break;
                    }
                    // A failed accept or dial drops that connection only:
                    // its client sees it closed and retries, as it would
                    // against the drafter itself.
                    let Ok(client) = conn else { continue };
                    let Ok(server) = TcpStream::connect(upstream) else {
                        continue;
                    };
                    let _ = splice(client, server, one_way);
                }
            })?;
        Ok(DelayProxy {
            addr,
            upstream,
            rtt,
            stop,
        })
    }

    /// Where to dial the proxied service.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    pub fn rtt(&self) -> Duration {
        self.rtt
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(100));
    }
}

/// Pipes `a` and `b` into each other, each direction delayed by `one_way`.
fn splice(a: TcpStream, b: TcpStream, one_way: Duration) -> io::Result<()> {
    // gRPC's small frames must not wait for Nagle on top of the delay.
    a.set_nodelay(true)?;
    b.set_nodelay(true)?;
    pipe(a.try_clone()?, b.try_clone()?, one_way)?;
    pipe(b, a, one_way)
}

/// One direction: a reader thread stamps each chunk with when it is due,
/// a writer thread sends it then. EOF or an error on either side closes
/// the write half of the other, so the peer sees the end too.
fn pipe(mut from: TcpStream, mut to: TcpStream, one_way: Duration) -> io::Result<()> {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let from_for_writer = from.try_clone()?;
    thread::Builder::new()
        .name("delay-read".into())
        .spawn(move || {
            let mut buf = vec![0u8; CHUNK];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx
                            .send((Instant::now() + one_way, buf[..n].to_vec()))
                            .is_err()
                        {
                            break;
                        }
                    }
                }
            }
        })?;
    thread::Builder::new()
        .name("delay-write".into())
        .spawn(move || {
            for (due, bytes) in rx {
                let now = Instant::now();
                if due > now {
                    thread::sleep(due - now);
                }
                if to.write_all(&bytes).is_err() {
                    // The receiver is gone: stop reading its sender too.
                    let _ = from_for_writer.shutdown(Shutdown::Read);
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        })?;
    Ok(())
}

/// The first address `addr` (`HOST:PORT`) resolves to.
pub fn resolve(addr: &str) -> io::Result<SocketAddr> {
    addr.to_socket_addrs()?.next().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{addr} resolves to nothing"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback: what the proxy is measured against.
    fn echo() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { continue };
                thread::spawn(move || {
                    let mut r = c.try_clone().unwrap();
                    let _ = io::copy(&mut r, &mut c);
                });
            }
        });
        addr
    }

    fn median_rtt(addr: SocketAddr, n: usize) -> Duration {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        let mut times = Vec::new();
        let mut buf = [0u8; 1];
        for i in 0..n {
            let t0 = Instant::now();
            s.write_all(&[i as u8]).unwrap();
            s.read_exact(&mut buf).unwrap();
            assert_eq!(buf[0], i as u8);
            times.push(t0.elapsed());
        }
        times.sort();
        times[n / 2]
    }

    #[test]
    fn adds_the_round_trip_it_was_given() {
        let upstream = echo();
        for ms in [1u64, 5, 20] {
            let rtt = Duration::from_millis(ms);
            let p = DelayProxy::start("127.0.0.1:0".parse().unwrap(), upstream, rtt).unwrap();
            let measured = median_rtt(p.addr(), 9);
            assert!(
                measured >= rtt && measured < rtt + Duration::from_millis(3),
                "asked for {rtt:?}, measured {measured:?}"
            );
        }
    }

    #[test]
    fn carries_bulk_in_order_and_passes_the_end_on() {
        let upstream = echo();
        let p = DelayProxy::start(
            "127.0.0.1:0".parse().unwrap(),
            upstream,
            Duration::from_millis(2),
        )
        .unwrap();
        let mut s = TcpStream::connect(p.addr()).unwrap();
        let sent: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut w = s.try_clone().unwrap();
        let to_send = sent.clone();
        let writer = thread::spawn(move || {
            w.write_all(&to_send).unwrap();
            w.shutdown(Shutdown::Write).unwrap();
        });
        let mut got = Vec::new();
        // The echo closes when it sees our end, through the proxy both ways.
        s.read_to_end(&mut got).unwrap();
        writer.join().unwrap();
        assert_eq!(got.len(), sent.len());
        assert!(got == sent, "bytes reordered or changed");
    }

    #[test]
    fn refuses_a_round_trip_out_of_range() {
        let args = LinkArgs {
            drafter_rtt_ms: Some(-1.0),
            ..LinkArgs::default()
        };
        let e = args.proxy_rtt().unwrap_err().to_string();
        assert!(e.contains("--drafter-rtt-ms -1"), "{e}");
        let netns = LinkArgs {
            drafter_netns: Some("d".into()),
            drafter_host: Some("10.250.0.2".parse().unwrap()),
            ..LinkArgs::default()
        };
        assert_eq!(netns.proxy_rtt().unwrap(), Some(Duration::ZERO));
        assert_eq!(LinkArgs::default().proxy_rtt().unwrap(), None);
    }
}
