//! The one receive thread of an initialized bootstrap: an event loop (`poll` over every peer
//! socket plus a wake-up socket) that reads whatever arrived, reassembles frames with a
//! [`FrameDecoder`] per peer and files them in the [`Mailbox`]. One thread per rank whatever
//! the number of peers (it was one per peer: N^2 threads per host). A peer whose socket
//! reports EOF, a reset or a corrupt frame is marked dead at once.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread::JoinHandle;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recv, MsgFlags};

use super::mailbox::Mailbox;
use super::wire::{Frame, FrameDecoder};
use crate::error::{Error, Result};

/// Bytes read per `recv`, and at most this many reads per peer per wake-up (fairness).
const READ_CHUNK: usize = 256 * 1024;
const READS_PER_WAKE: usize = 8;

/// A peer socket the loop reads.
pub(super) struct Watched {
    pub(super) peer: usize,
    pub(super) addr: SocketAddr,
    pub(super) stream: Arc<TcpStream>,
}

/// The running loop; dropping it stops and joins the thread.
pub(super) struct Receiver {
    wake: UnixStream,
    thread: Option<JoinHandle<()>>,
}

impl Receiver {
    /// Starts the loop of rank `me` over `peers`.
    pub(super) fn start(me: usize, peers: Vec<Watched>, mailbox: Arc<Mailbox>) -> Result<Receiver> {
        let (wake, wake_rx) = UnixStream::pair()
            .map_err(|e| Error::io("socketpair for the bootstrap receiver", e))?;
        let thread = std::thread::Builder::new()
            .name(format!("mscclpp-bootstrap-recv-{me}"))
            .spawn(move || run(peers, wake_rx, &mailbox))
            .map_err(|e| Error::io("spawn the bootstrap receive thread", e))?;
        Ok(Receiver {
            wake,
            thread: Some(thread),
        })
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        // One byte (or the closed pair) ends the loop; either way the join below returns.
        let _ = self.wake.write_all(&[1]);
        let _ = self.wake.shutdown(std::net::Shutdown::Both);
        if let Some(t) = self.thread.take() {
            // The loop does not panic; if it did, there is nothing left to clean up.
            let _ = t.join();
        }
    }
}

struct PeerState {
    w: Watched,
    decoder: FrameDecoder,
    live: bool,
}

impl PeerState {
    fn gone(&mut self, mailbox: &Mailbox, why: String) {
        self.live = false;
        mailbox.mark_dead(self.w.peer, why);
    }

    fn closed_why(&self, what: &str) -> String {
        let (peer, addr) = (self.w.peer, self.w.addr);
        let mid = match self.decoder.partial() {
            Some((got, len)) => format!(" in the middle of a message ({got} of {len} bytes)"),
            None => String::new(),
        };
        format!("connection to rank {peer} ({addr}) {what}{mid}: the peer exited or dropped its bootstrap")
    }

    /// Reads what is there (never blocking); files complete frames.
    fn read_ready(&mut self, buf: &mut [u8], mailbox: &Mailbox) {
        let peer = self.w.peer;
        for _ in 0..READS_PER_WAKE {
            match recv(self.w.stream.as_raw_fd(), buf, MsgFlags::MSG_DONTWAIT) {
                Ok(0) => return self.gone(mailbox, self.closed_why("closed (EOF)")),
                Ok(n) => {
                    let mut sink = |f: Frame| mailbox.push((peer, f.kind, f.tag), f.payload);
                    if let Err(e) = self.decoder.feed(&buf[..n], &mut sink) {
                        let why =
                            format!("rank {peer} ({}) sent a corrupt stream: {e}", self.w.addr);
                        return self.gone(mailbox, why);
                    }
                    if n < buf.len() {
                        return;
                    }
                }
                Err(Errno::EAGAIN) => return,
                Err(Errno::EINTR) => {}
                Err(Errno::ECONNRESET) => return self.gone(mailbox, self.closed_why("was reset")),
                Err(e) => {
                    let why = format!("reading from rank {peer} ({}) failed: {e}", self.w.addr);
                    return self.gone(mailbox, why);
                }
            }
        }
    }
}

fn run(peers: Vec<Watched>, wake: UnixStream, mailbox: &Mailbox) {
    let mut peers: Vec<PeerState> = peers
        .into_iter()
        .map(|w| PeerState {
            w,
            decoder: FrameDecoder::default(),
            live: true,
        })
        .collect();
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let live: Vec<usize> = (0..peers.len()).filter(|&i| peers[i].live).collect();
        let ready: Vec<(usize, PollFlags)> = {
            let mut fds = Vec::with_capacity(live.len() + 1);
            fds.push(PollFd::new(wake.as_fd(), PollFlags::POLLIN));
            for &i in &live {
                fds.push(PollFd::new(peers[i].w.stream.as_fd(), PollFlags::POLLIN));
            }
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    for p in peers.iter_mut().filter(|p| p.live) {
                        let why = format!("the bootstrap receive loop failed: poll: {e}");
                        p.gone(mailbox, why);
                    }
                    return;
                }
            }
            if fds[0].any().unwrap_or(true) {
                return; // woken: the session is closing
            }
            fds[1..]
                .iter()
                .zip(&live)
                .filter_map(|(fd, &i)| {
                    let ev = fd.revents().unwrap_or(PollFlags::POLLERR);
                    (!ev.is_empty()).then_some((i, ev))
                })
                .collect()
        };
        for (i, ev) in ready {
            if ev.contains(PollFlags::POLLNVAL) {
                let why = format!("the socket of rank {} is not open", peers[i].w.peer);
                peers[i].gone(mailbox, why);
            } else {
                // POLLIN, POLLHUP and POLLERR all resolve through recv (data, 0 or the error).
                peers[i].read_ready(&mut buf, mailbox);
            }
        }
    }
}
