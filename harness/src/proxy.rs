//! A fault-injecting TCP proxy between a client and one Redis node, on tokio.
//!
//! Faults apply to live connections at once and to new ones, and keep what
//! TCP promises: bytes are delivered in order or the connection breaks. (A
//! proxy that silently ate bytes inside a live connection would shift every
//! later reply onto the wrong request, a fault no real network produces.)
//! - added latency on the replies (each chunk held back by the delay from
//!   the moment it arrived, so pipelined replies are not delayed twice);
//! - blackhole: a partition. Connections are accepted and kept, nothing
//!   moves in either direction; what was sent waits in the socket buffers and
//!   arrives, late and in order, when the partition heals;
//! - drop replies: commands reach the node and run, then the connection
//!   breaks before the reply gets back (the node applied a write the client
//!   never hears of);
//! - reset: every connection is closed with a TCP reset, new ones too.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What the proxy does to the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything, with this much latency added to each reply.
    Latency(Duration),
    /// Accept and hold connections, move nothing until healed.
    Blackhole,
    /// Forward commands, then break the connection instead of replying.
    DropReplies,
    /// Reset every connection, and each new one.
    Reset,
    /// Forward everything, holding each chunk of requests this long before
    /// it goes upstream (so that requests of several clients reach nodes
    /// in different orders).
    RequestLatency(Duration),
}

impl Fault {
    /// No fault.
    pub const NONE: Fault = Fault::Latency(Duration::ZERO);
}

/// A proxy to one upstream address. Stops when dropped.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    fault: watch::Sender<Fault>,
    task: tokio::task::JoinHandle<()>,
    connections: Arc<Mutex<u64>>,
}

impl Proxy {
    /// Starts a proxy on a free loopback port in front of `upstream`. Must be
    /// called inside a Tokio runtime.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let (fault, fault_rx) = watch::channel(Fault::NONE);
        let connections = Arc::new(Mutex::new(0));
        let count = connections.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                *count.lock().unwrap() += 1;
                let fault_rx = fault_rx.clone();
                tokio::spawn(async move {
                    let _ = serve(client, upstream, fault_rx).await;
                });
            }
        });
        Proxy {
            addr,
            fault,
            task,
            connections,
        }
    }

    /// Starts a proxy in front of `redis://127.0.0.1:PORT/`.
    pub async fn to_port(port: u16) -> Self {
        Self::start(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await
    }

    /// `redis://127.0.0.1:PORT/` of the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.addr.port())
    }

    /// Sets the fault; live connections follow at once.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// The fault in force.
    pub fn fault(&self) -> Fault {
        *self.fault.borrow()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        *self.connections.lock().unwrap()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn reset(stream: TcpStream) {
    // SO_LINGER 0 makes close() send RST instead of FIN.
    let _ = stream.set_zero_linger();
    drop(stream);
}

async fn serve(
    client: TcpStream,
    upstream: SocketAddr,
    mut fault: watch::Receiver<Fault>,
) -> std::io::Result<()> {
    let now = *fault.borrow();
    if now == Fault::Reset {
        reset(client);
        return Ok(());
    }
    let server = TcpStream::connect(upstream).await?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (mut client_rd, mut client_wr) = client.into_split();
    let (mut server_rd, mut server_wr) = server.into_split();

    // Replies pass through a queue stamped with their release time, so that
    // latency is added once per chunk, not accumulated.
    let (reply_tx, mut reply_rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((at, bytes)) = reply_rx.recv().await {
            // Tokio's timer has millisecond ticks, which would turn a 0.5 ms
            // delay into 1-2 ms; a blocking-pool sleep is good to ~0.1 ms.
            let wait = at.saturating_duration_since(Instant::now());
            if !wait.is_zero() {
                let _ = tokio::task::spawn_blocking(move || std::thread::sleep(wait)).await;
            }
            if client_wr.write_all(&bytes).await.is_err() {
                break;
            }
        }
        client_wr
    });

    let mut up = [0u8; 16 * 1024];
    let mut down = [0u8; 16 * 1024];
    loop {
        let now = *fault.borrow();
        match now {
            Fault::Reset => break,
            // A partition: read nothing, so that nothing moves; the bytes
            // wait in the socket buffers until the fault changes.
            Fault::Blackhole => {
                if fault.changed().await.is_err() {
                    break;
                }
                continue;
            }
            Fault::Latency(_) | Fault::DropReplies | Fault::RequestLatency(_) => {}
        }
        tokio::select! {
            changed = fault.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            n = client_rd.read(&mut up) => {
                let n = n?;
                if n == 0 { break; }
                let hold = match *fault.borrow() {
                    Fault::RequestLatency(d) => d,
                    _ => Duration::ZERO,
                };
                if !hold.is_zero() {
                    let _ = tokio::task::spawn_blocking(move || std::thread::sleep(hold)).await;
                }
                server_wr.write_all(&up[..n]).await?;
            }
            n = server_rd.read(&mut down) => {
                let n = n?;
                if n == 0 { break; }
                let now = *fault.borrow();
                match now {
                    Fault::Latency(d) => {
                        let _ = reply_tx.send((Instant::now() + d, down[..n].to_vec()));
                    }
                    Fault::RequestLatency(_) => {
                        let _ = reply_tx.send((Instant::now(), down[..n].to_vec()));
                    }
                    // The command ran; the reply is lost with the connection.
                    Fault::DropReplies | Fault::Blackhole | Fault::Reset => break,
                }
            }
        }
    }
    drop(reply_tx);
    // Close both sides with a reset, as a dropped network path or a reset
    // fault would.
    if let Ok(client_wr) = writer.await
        && let Ok(stream) = client_rd.reunite(client_wr)
    {
        reset(stream);
    }
    if let Ok(stream) = server_rd.reunite(server_wr) {
        reset(stream);
    }
    Ok(())
}
