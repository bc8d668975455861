//! Who holds the exporter's connections, and who gives way when they run out.
//!
//! A connection is *protected* while the server works for it: from a complete request
//! head to its response handed to the kernel, as long as the peer keeps reading. Every
//! other connection (accepted but not yet sent a whole request, idle between requests,
//! or a response stuck because its peer does not read) is *idle* and can be evicted.
//!
//! When a new connection would go over a limit, an idle one gives way instead of the new
//! one being refused: within the same peer when that peer holds `max_per_peer`, otherwise
//! from the peer holding the most connections. Within a peer the one least recently active
//! (accepted, or its last request) goes first. A slowloris or a client that never reads
//! therefore only ever displaces its own kind, oldest first, while a scrape — which sends
//! its request as soon as it connects — is the newest and is served before its turn could
//! come. Only when every connection that could give way is protected is a new one closed.
//!
//! Peers: an IPv4 address; an IPv6 /64 (one host owns a /64 and can pick any address in
//! it); every loopback address (127.0.0.0/8, ::1) counts as one peer, since any local user
//! can bind any address of 127/8.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio::sync::Notify;

/// Default of `--web.max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default of `--web.max-connections-per-peer`.
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: usize = 256;

/// The unit the per-peer limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerKey {
    /// Any loopback address: every local user.
    Loopback,
    /// One IPv4 address.
    V4(u32),
    /// One IPv6 /64.
    V6(u64),
}

impl PeerKey {
    /// The peer `ip` counts as.
    pub fn of(ip: IpAddr) -> Self {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            IpAddr::V4(_) => ip,
        };
        if ip.is_loopback() {
            return Self::Loopback;
        }
        match ip {
            IpAddr::V4(v4) => Self::V4(u32::from(v4)),
            IpAddr::V6(v6) => Self::V6((u128::from(v6) >> 64) as u64),
        }
    }
}

/// What the server and the connection's I/O tell the registry about one connection.
#[derive(Debug)]
pub struct ConnState {
    /// Milliseconds since the registry's start at the last activity: accepted, or the
    /// last request head received.
    last_active_ms: AtomicU64,
    /// A request is in the service (auth, rendering).
    in_service: AtomicBool,
    /// A response is being written (set at the first write, cleared once flushed).
    writing: AtomicBool,
    /// The last write attempt found the socket's send buffer full: the peer is not reading.
    write_blocked: AtomicBool,
    /// Signalled when this connection is evicted; its task then drops the socket.
    evicted: Notify,
}

impl ConnState {
    fn new(now_ms: u64) -> Self {
        Self {
            last_active_ms: AtomicU64::new(now_ms),
            in_service: AtomicBool::new(false),
            writing: AtomicBool::new(false),
            write_blocked: AtomicBool::new(false),
            evicted: Notify::new(),
        }
    }

    fn protected(&self) -> bool {
        self.in_service.load(Ordering::Relaxed)
            || (self.writing.load(Ordering::Relaxed) && !self.write_blocked.load(Ordering::Relaxed))
    }

    /// Resolves once the registry evicted this connection.
    pub async fn evicted(&self) {
        self.evicted.notified().await;
    }

    /// The response writer's view: a write started, was blocked, or completed.
    pub fn set_writing(&self, writing: bool, blocked: bool) {
        self.writing.store(writing, Ordering::Relaxed);
        self.write_blocked.store(blocked, Ordering::Relaxed);
    }
}

/// Limits of [`Registry`].
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Open connections at most.
    pub max_connections: usize,
    /// Open connections of one peer at most.
    pub max_per_peer: usize,
}

/// Counts of what the registry did, for the logs and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// Idle connections closed to make room.
    pub evicted: u64,
    /// New connections closed because nothing could give way.
    pub refused: u64,
}

#[derive(Debug)]
struct Entry {
    peer: PeerKey,
    state: Arc<ConnState>,
}

#[derive(Debug, Default)]
struct Inner {
    next_id: u64,
    conns: HashMap<u64, Entry>,
    per_peer: HashMap<PeerKey, usize>,
    tally: Tally,
}

impl Inner {
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.conns.remove(&id)?;
        if let Some(count) = self.per_peer.get_mut(&entry.peer) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.per_peer.remove(&entry.peer);
            }
        }
        Some(entry)
    }

    /// The idle connection to evict: of `peer` when given, else of the peer holding the
    /// most connections; least recently active first.
    fn victim(&self, peer: Option<PeerKey>) -> Option<u64> {
        self.conns
            .iter()
            .filter(|(_, entry)| peer.is_none_or(|p| entry.peer == p))
            .filter(|(_, entry)| !entry.state.protected())
            .max_by_key(|(id, entry)| {
                let held = self.per_peer.get(&entry.peer).copied().unwrap_or(0);
                let age = u64::MAX - entry.state.last_active_ms.load(Ordering::Relaxed);
                // The id breaks ties the same way every time (older first).
                (held, age, u64::MAX - **id)
            })
            .map(|(id, _)| *id)
    }

    fn evict(&mut self, id: u64) {
        if let Some(entry) = self.remove(id) {
            self.tally.evicted += 1;
            entry.state.evicted.notify_one();
        }
    }
}

/// The open connections and their limits. Shared by the accept loop and every
/// connection's task (one thread: the lock is never contended).
#[derive(Debug)]
pub struct Registry {
    limits: Limits,
    epoch: Instant,
    inner: Mutex<Inner>,
}

/// One admitted connection; dropping it frees its place.
#[derive(Debug)]
pub struct Slot {
    registry: Arc<Registry>,
    id: u64,
    /// What the connection reports about itself.
    pub state: Arc<ConnState>,
}

impl Slot {
    /// A request head arrived: the connection is protected until its service returns.
    pub fn request_started(&self) {
        self.state
            .last_active_ms
            .store(self.registry.now_ms(), Ordering::Relaxed);
        self.state.in_service.store(true, Ordering::Relaxed);
    }

    /// The service returned its response (hyper writes it next).
    pub fn request_answered(&self) {
        self.state.in_service.store(false, Ordering::Relaxed);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.registry.lock().remove(self.id);
    }
}

impl Registry {
    /// A registry with these limits (`max_per_peer` is at most `max_connections`, both at
    /// least 1).
    pub fn new(limits: Limits) -> Self {
        let max_connections = limits.max_connections.max(1);
        Self {
            limits: Limits {
                max_connections,
                max_per_peer: limits.max_per_peer.clamp(1, max_connections),
            },
            epoch: Instant::now(),
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Nothing here is left half-updated by a panic: a poisoned lock is still good.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Admits a connection from `ip`, evicting an idle one when a limit is reached;
    /// `None` when nothing can give way (the caller closes the new connection).
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Slot> {
        let peer = PeerKey::of(ip);
        let now_ms = self.now_ms();
        let mut inner = self.lock();
        let held = inner.per_peer.get(&peer).copied().unwrap_or(0);
        let victim = if held >= self.limits.max_per_peer {
            Some(inner.victim(Some(peer)))
        } else if inner.conns.len() >= self.limits.max_connections {
            Some(inner.victim(None))
        } else {
            None
        };
        match victim {
            Some(None) => {
                inner.tally.refused += 1;
                return None;
            }
            Some(Some(id)) => inner.evict(id),
            None => {}
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let state = Arc::new(ConnState::new(now_ms));
        inner.conns.insert(
            id,
            Entry {
                peer,
                state: Arc::clone(&state),
            },
        );
        *inner.per_peer.entry(peer).or_insert(0) += 1;
        Some(Slot {
            registry: Arc::clone(self),
            id,
            state,
        })
    }

    /// Evicts one idle connection (the accept loop frees a file descriptor this way when
    /// the process has none left). False when none is idle.
    pub fn evict_one(&self) -> bool {
        let mut inner = self.lock();
        match inner.victim(None) {
            Some(id) => {
                inner.evict(id);
                true
            }
            None => false,
        }
    }

    /// Open connections.
    pub fn open(&self) -> usize {
        self.lock().conns.len()
    }

    /// What the registry did so far.
    pub fn tally(&self) -> Tally {
        self.lock().tally
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("address")
    }

    fn registry(max_connections: usize, max_per_peer: usize) -> Arc<Registry> {
        Arc::new(Registry::new(Limits {
            max_connections,
            max_per_peer,
        }))
    }

    fn is_evicted(slot: &Slot) -> bool {
        !slot.registry.lock().conns.contains_key(&slot.id)
    }

    #[test]
    fn every_loopback_address_is_one_peer_and_ipv6_counts_by_64() {
        assert_eq!(PeerKey::of(ip("127.0.0.1")), PeerKey::Loopback);
        assert_eq!(PeerKey::of(ip("127.8.9.10")), PeerKey::Loopback);
        assert_eq!(PeerKey::of(ip("::1")), PeerKey::Loopback);
        assert_eq!(PeerKey::of(ip("::ffff:127.0.0.2")), PeerKey::Loopback);
        assert_eq!(
            PeerKey::of(ip("::ffff:10.0.0.1")),
            PeerKey::of(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)))
        );
        assert_eq!(
            PeerKey::of(ip("2001:db8::1")),
            PeerKey::of(IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 9, 9, 9, 9)))
        );
        assert_ne!(
            PeerKey::of(ip("2001:db8::1")),
            PeerKey::of(ip("2001:db8:0:1::1"))
        );
    }

    #[test]
    fn a_peer_at_its_limit_displaces_its_own_oldest_idle_connection() {
        let registry = registry(100, 3);
        let first = registry.admit(ip("127.0.0.1")).expect("admitted");
        let second = registry.admit(ip("127.0.0.2")).expect("admitted");
        let third = registry.admit(ip("127.0.0.1")).expect("admitted");
        let other = registry.admit(ip("10.0.0.1")).expect("admitted");
        let fourth = registry.admit(ip("127.0.0.1")).expect("admitted");
        assert!(
            is_evicted(&first),
            "the oldest idle loopback connection went"
        );
        assert!(!is_evicted(&second) && !is_evicted(&third) && !is_evicted(&fourth));
        assert!(!is_evicted(&other), "another peer is never touched");
        assert_eq!(registry.open(), 4);
        assert_eq!(registry.tally().evicted, 1);
    }

    #[test]
    fn connections_being_served_are_never_evicted() {
        let registry = registry(100, 2);
        let serving = registry.admit(ip("127.0.0.1")).expect("admitted");
        serving.request_started();
        let idle = registry.admit(ip("127.0.0.1")).expect("admitted");
        let new = registry.admit(ip("127.0.0.1")).expect("admitted");
        assert!(!is_evicted(&serving));
        assert!(is_evicted(&idle));
        // Writing a response to a peer that reads: protected; one that does not: idle.
        serving.request_answered();
        serving.state.set_writing(true, false);
        new.request_started();
        assert!(
            registry.admit(ip("127.0.0.1")).is_none(),
            "nothing idle: the new one is refused"
        );
        assert_eq!(registry.tally().refused, 1);
        serving.state.set_writing(true, true);
        let _newest = registry.admit(ip("127.0.0.1")).expect("admitted");
        assert!(
            is_evicted(&serving),
            "a response its peer does not read gives way"
        );
        assert!(!is_evicted(&new));
    }

    #[test]
    fn the_global_cap_takes_from_the_peer_holding_the_most() {
        let registry = registry(4, 4);
        let scraper = registry.admit(ip("10.0.0.9")).expect("admitted");
        let hog: Vec<Slot> = (0..3)
            .map(|_| registry.admit(ip("127.0.0.1")).expect("admitted"))
            .collect();
        let _another = registry.admit(ip("10.0.0.8")).expect("admitted");
        assert!(!is_evicted(&scraper), "the scraper's idle keep-alive stays");
        assert!(is_evicted(&hog[0]));
        assert!(!is_evicted(&hog[1]) && !is_evicted(&hog[2]));
    }

    #[test]
    fn dropping_a_slot_frees_its_place() {
        let registry = registry(1, 1);
        let slot = registry.admit(ip("127.0.0.1")).expect("admitted");
        slot.request_started();
        assert!(registry.admit(ip("10.0.0.1")).is_none());
        drop(slot);
        assert!(registry.admit(ip("10.0.0.1")).is_some());
        assert_eq!(registry.open(), 0, "the admitted one was dropped at once");
    }
}
