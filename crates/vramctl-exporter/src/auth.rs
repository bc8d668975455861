//! HTTP basic auth against bcrypt hashes, the way exporter-toolkit does it.
//!
//! - An unknown user is checked against a dummy hash of the **same cost** as the real
//!   ones, so "no such user" and "wrong password" do the same bcrypt work and take the
//!   same time (no user enumeration by timing). The toolkit uses a fixed cost-10 dummy;
//!   matching the configured cost also covers files with cost 12 hashes.
//! - bcrypt runs one at a time (a mutex): a flood of guesses costs one core, not all.
//! - Outcomes are cached per (user, password), so Prometheus' scrape every few seconds pays
//!   bcrypt once, not every time. Credentials that passed are kept apart from those that
//!   failed: a flood of wrong passwords fills (and clears) only the cache of failures, so a
//!   scrape whose credentials passed once is answered from [`Authenticator::cached`]
//!   without queueing behind the flood's bcrypt runs.
//!
//! [`Authenticator::check`] blocks for a bcrypt (tens of ms at cost 10): the server runs it
//! on tokio's blocking pool, a few at a time (`server::MAX_PENDING_VERIFICATIONS`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use anyhow::bail;
use base64::Engine as _;

/// Most cached failures; beyond it that cache starts over (an attacker trying many
/// passwords cannot grow it, nor push out credentials that passed).
const CACHE_CAPACITY: usize = 100;
/// Most cached credentials that passed. Only someone who knows a password can add one
/// (bcrypt ignores what follows a password's 72nd byte, so one password has many forms):
/// bounded all the same.
const VERIFIED_CAPACITY: usize = 32;

/// Salt of the dummy hash: any fixed value does, the hash is never matched.
const DUMMY_SALT: [u8; 16] = *b"vramctl-no-user!";

/// Checks `Authorization: Basic …` headers.
#[derive(Debug)]
pub struct Authenticator {
    users: BTreeMap<String, String>,
    dummy_hash: String,
    bcrypt: Mutex<()>,
    /// Credentials that failed.
    cache: Mutex<HashMap<(String, String), bool>>,
    /// Credentials that passed.
    verified: Mutex<HashSet<(String, String)>>,
    bcrypt_runs: AtomicU64,
}

impl Authenticator {
    /// Users and their bcrypt hashes.
    ///
    /// # Errors
    /// A password that is not a bcrypt hash (`$2a$`, `$2b$`, `$2y$`).
    pub fn new(users: BTreeMap<String, String>) -> anyhow::Result<Self> {
        let mut cost = 0;
        for (user, hash) in &users {
            let Ok(parts) = hash.parse::<bcrypt::HashParts>() else {
                bail!(
                    "basic_auth_users: the password of '{user}' is not a bcrypt hash; \
                     generate one with 'htpasswd -nBC 10 \"\" | tr -d ':'' or Python's bcrypt"
                );
            };
            cost = cost.max(parts.get_cost());
        }
        let dummy_hash = bcrypt::hash_with_salt(b"vramctl dummy password", cost, DUMMY_SALT)?
            .format_for_version(bcrypt::Version::TwoB);
        Ok(Self {
            users,
            dummy_hash,
            bcrypt: Mutex::new(()),
            cache: Mutex::new(HashMap::new()),
            verified: Mutex::new(HashSet::new()),
            bcrypt_runs: AtomicU64::new(0),
        })
    }

    /// The outcome for `authorization` when it needs no bcrypt: a header that is not basic
    /// auth (false), or credentials checked before. `None`: [`Self::check`] must run.
    /// Cheap; the server calls it before queueing a bcrypt.
    pub fn cached(&self, authorization: &str) -> Option<bool> {
        let Some(key) = parse_basic(authorization) else {
            return Some(false);
        };
        self.lookup(&key)
    }

    fn lookup(&self, key: &(String, String)) -> Option<bool> {
        if self
            .verified
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(key)
        {
            return Some(true);
        }
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .copied()
    }

    /// Whether `authorization` (the header's value) carries a valid user and password.
    pub fn check(&self, authorization: Option<&str>) -> bool {
        let Some(key) = authorization.and_then(parse_basic) else {
            return false;
        };
        if let Some(ok) = self.lookup(&key) {
            return ok;
        }
        let (user, password) = &key;
        let (hash, known) = match self.users.get(user) {
            Some(hash) => (hash.as_str(), true),
            None => (self.dummy_hash.as_str(), false),
        };
        let matched = {
            let _one_at_a_time = self.bcrypt.lock().unwrap_or_else(PoisonError::into_inner);
            self.bcrypt_runs.fetch_add(1, Ordering::Relaxed);
            bcrypt::verify(password, hash).unwrap_or(false)
        };
        let ok = known && matched;
        if ok {
            let mut verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
            if verified.len() >= VERIFIED_CAPACITY {
                verified.clear();
            }
            verified.insert(key);
        } else {
            let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            if cache.len() >= CACHE_CAPACITY {
                cache.clear();
            }
            cache.insert(key, false);
        }
        ok
    }

    /// How many bcrypt verifications ran (tests check unknown users cost one too).
    #[cfg(test)]
    pub fn bcrypt_runs(&self) -> u64 {
        self.bcrypt_runs.load(Ordering::Relaxed)
    }

    /// The cost of the hash an unknown user is checked against: the highest of the
    /// configured hashes.
    #[cfg(test)]
    pub fn dummy_cost(&self) -> Option<u32> {
        self.dummy_hash
            .parse::<bcrypt::HashParts>()
            .ok()
            .map(|p| p.get_cost())
    }
}

/// `Basic base64(user:password)` → (user, password).
fn parse_basic(header: &str) -> Option<(String, String)> {
    let (scheme, encoded) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(user: &str, password: &str) -> String {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )
    }

    fn authenticator(cost: u32) -> Authenticator {
        let mut users = BTreeMap::new();
        users.insert(
            "prometheus".to_owned(),
            bcrypt::hash("right", cost).expect("hash"),
        );
        Authenticator::new(users).expect("valid")
    }

    #[test]
    fn right_password_passes_and_wrong_fails() {
        let auth = authenticator(4);
        assert!(auth.check(Some(&header("prometheus", "right"))));
        assert!(!auth.check(Some(&header("prometheus", "wrong"))));
        assert!(!auth.check(Some(&header("nobody", "right"))));
        assert!(!auth.check(None));
        assert!(!auth.check(Some("Bearer abc")));
        assert!(!auth.check(Some("Basic not-base64!")));
    }

    #[test]
    fn unknown_users_do_the_same_bcrypt_work() {
        // Structural, not timed: the same number of bcrypt runs, at the same cost.
        let auth = authenticator(5);
        assert_eq!(auth.dummy_cost(), Some(5));
        let before = auth.bcrypt_runs();
        assert!(!auth.check(Some(&header("prometheus", "wrong"))));
        assert_eq!(
            auth.bcrypt_runs(),
            before + 1,
            "a known user costs one bcrypt"
        );
        assert!(!auth.check(Some(&header("mallory", "wrong"))));
        assert_eq!(
            auth.bcrypt_runs(),
            before + 2,
            "an unknown user costs one too"
        );
    }

    #[test]
    fn outcomes_are_cached() {
        let auth = authenticator(4);
        assert!(auth.check(Some(&header("prometheus", "right"))));
        assert!(auth.check(Some(&header("prometheus", "right"))));
        assert!(!auth.check(Some(&header("mallory", "x"))));
        assert!(!auth.check(Some(&header("mallory", "x"))));
        assert_eq!(auth.bcrypt_runs(), 2);
    }

    #[test]
    fn the_cache_is_bounded() {
        let auth = authenticator(4);
        for i in 0..(CACHE_CAPACITY + 5) {
            auth.check(Some(&header("mallory", &i.to_string())));
        }
        let len = auth.cache.lock().expect("lock").len();
        assert!(len <= CACHE_CAPACITY, "{len}");
    }

    #[test]
    fn a_flood_of_wrong_passwords_never_pushes_out_credentials_that_passed() {
        let auth = authenticator(4);
        let right = header("prometheus", "right");
        assert_eq!(auth.cached(&right), None, "not checked yet");
        assert!(auth.check(Some(&right)));
        for i in 0..(3 * CACHE_CAPACITY) {
            assert!(!auth.check(Some(&header("prometheus", &format!("guess{i}")))));
        }
        assert_eq!(
            auth.cached(&right),
            Some(true),
            "still answered without bcrypt"
        );
        assert_eq!(auth.cached("Bearer x"), Some(false), "not basic: no bcrypt");
        assert_eq!(auth.cached(&header("prometheus", "new guess")), None);
    }

    #[test]
    fn passwords_may_contain_colons() {
        assert_eq!(
            parse_basic(&header("u", "a:b")),
            Some(("u".to_owned(), "a:b".to_owned()))
        );
    }
}
