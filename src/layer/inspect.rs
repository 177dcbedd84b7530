//! Reading and clearing a key's state under every rule of a
//! [`ThrottleLayer`], outside of requests: support tooling, admin
//! endpoints, tests. By key part ([`ThrottleLayer::peek`]), or by what the
//! app knows of a client, through the rules' own extractors
//! ([`ThrottleLayer::peek_request`], see [`crate::inspect`]).

use std::future::Future;
use std::sync::Arc;

use super::ThrottleLayer;
use crate::inspect::{AsRequestHead, KeyStates, RuleState};
use crate::key::{bound_key_part, KeyWriter, MissingKey, RequestHead, MAX_KEY_PART};
use crate::limiter::RuleDecisions;
use crate::policy::Policy;
use crate::resolve::{PolicyResolver, PolicySource};
use crate::rule::Rule;
use crate::store::{Charge, Store, StoreError};

/// One rule's key for a client, as a request of that client builds it.
struct ClientKey {
    rule: Arc<str>,
    key: Result<Vec<u8>, MissingKey>,
    policy: Policy,
    /// A resolver still to be asked for the client's policy, with where
    /// the key part starts.
    pending: Option<(Arc<dyn PolicyResolver>, usize)>,
}

impl<St: Store> ThrottleLayer<St> {
    /// What a request whose key is `key` (the part the rules' extractors
    /// write: a header's value, a client address as text) would see under
    /// each rule, without charging anything: each rule's
    /// [`Decision`](crate::Decision) of a check of cost 0, by rule name:
    /// `remaining` says how many units a request could take.
    /// Rules take their own policy (a per-request policy is the request's
    /// to choose); a lock-out is read with
    /// [`Limiter::locked_for`](crate::Limiter::locked_for). To ask by what
    /// the app knows (a token, an address, a user id), whatever each rule
    /// keys by, use [`peek_request`](Self::peek_request): the rules'
    /// extractors build the keys, digests included.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::{key::HeaderKey, MemoryStore, Policy, ThrottleLayer};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let layer = ThrottleLayer::new(MemoryStore::new(), Policy::fixed_window(5, Duration::from_secs(60))?)
    ///     .key(HeaderKey::new(http::HeaderName::from_static("x-user")));
    /// let state = layer.peek("user-42").await?;
    /// assert_eq!(state.get("default").unwrap().remaining, 5);
    /// layer.reset("user-42").await?; // forgets the key under every rule
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn peek(&self, key: impl AsRef<[u8]>) -> Result<RuleDecisions, StoreError> {
        let keys = self.rule_keys(key.as_ref());
        let charges: Vec<Charge<'_>> = (self.limits.iter())
            .zip(&keys)
            .map(|(rule, key)| Charge::new(key, &rule.policy, 0))
            .collect();
        let decisions = self.store.check_all(&charges).await?;
        let names = self.limits.iter().map(|r| (r.name.clone(), r.policy));
        Ok(RuleDecisions::of_rules(names, decisions))
    }

    /// Forgets `key` under every rule (a support action: a user wrongly
    /// limited gets a fresh quota at once).
    pub async fn reset(&self, key: impl AsRef<[u8]>) -> Result<(), StoreError> {
        let keys = self.rule_keys(key.as_ref());
        for (rule, key) in self.limits.iter().zip(&keys) {
            self.store.reset(key, &rule.policy).await?;
        }
        Ok(())
    }

    /// Every rule's store key for the key part `key`, as a request builds it.
    fn rule_keys(&self, key: &[u8]) -> Vec<Vec<u8>> {
        (self.limits.iter())
            .map(|rule| {
                let mut full = self.key_head(rule);
                let part = full.len();
                full.extend_from_slice(key);
                bound_key_part(&mut full, part, MAX_KEY_PART);
                full
            })
            .collect()
    }
}

impl<St: Store> ThrottleLayer<St> {
    /// What the requests of a client would see under each rule, read
    /// without charging: every rule runs its own key extractor on
    /// `client` (a [`Client`](crate::inspect::Client) built from what the
    /// app knows, a request, a request head) and its state is peeked as
    /// [`peek`](Self::peek) does, in one store call, whatever the store.
    /// A rule's policy is the one the client's requests get (its policy
    /// function's or resolver's pick, a resolver asked within the layer's
    /// store timeout). A rule that finds no key in `client` is reported in
    /// [`RuleState::key`], not as an error; `Err` is the store's failure.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::inspect::Client;
    /// use tower_throttle::key::{BearerToken, PeerIp};
    /// use tower_throttle::{MemoryStore, Policy, Rule, ThrottleLayer};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let layer = ThrottleLayer::new(MemoryStore::new(), Policy::fixed_window(5, Duration::from_secs(60))?)
    ///     .name("token")
    ///     .key(BearerToken)
    ///     .and(Rule::new("ip", Policy::fixed_window(50, Duration::from_secs(60))?).key(PeerIp::new()));
    /// let state = layer.peek_request(&Client::bearer("s3cr3t")).await?;
    /// assert_eq!(state.get("token").unwrap().decision.unwrap().remaining, 5);
    /// assert!(state.get("ip").unwrap().key.is_err()); // no address given
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn peek_request<R: AsRequestHead + ?Sized>(
        &self,
        client: &R,
    ) -> impl Future<Output = Result<KeyStates, StoreError>> + Send + '_ {
        // The keys are built now: the future borrows nothing of `client`.
        let keys = self.client_keys(&client.request_head());
        async move {
            let keys = self.resolve_policies(keys).await;
            let charges: Vec<Charge<'_>> = (keys.iter())
                .filter_map(|k| Some(Charge::new(k.key.as_ref().ok()?, &k.policy, 0)))
                .collect();
            let decisions = match charges.is_empty() {
                true => Vec::new(),
                false => self.store.check_all(&charges).await?,
            };
            let mut decisions = decisions.into_iter();
            let states = (keys.into_iter())
                .map(|k| {
                    let decision = k.key.is_ok().then(|| decisions.next()).flatten();
                    state(k, decision)
                })
                .collect();
            Ok(KeyStates::new(states))
        }
    }

    /// Forgets a client's key under every rule that finds one in `client`
    /// (see [`peek_request`](Self::peek_request)): its next request sees a
    /// fresh state. Answers each rule's key, or why it has none, with no
    /// decision; stops at the store's first failure.
    pub fn reset_request<R: AsRequestHead + ?Sized>(
        &self,
        client: &R,
    ) -> impl Future<Output = Result<KeyStates, StoreError>> + Send + '_ {
        let keys = self.client_keys(&client.request_head());
        async move {
            let keys = self.resolve_policies(keys).await;
            for k in &keys {
                if let Ok(key) = &k.key {
                    self.store.reset(key, &k.policy).await?;
                }
            }
            Ok(KeyStates::new(
                keys.into_iter().map(|k| state(k, None)).collect(),
            ))
        }
    }

    /// Every rule's key for the request head `req`, built as the layer
    /// builds a request's (`check::plan`): the rule's extractor, the bound
    /// on the part's length, and the tag of a policy of the request's own.
    fn client_keys(&self, req: &RequestHead<'_>) -> Vec<ClientKey> {
        (self.limits.iter())
            .map(|rule| self.client_key(rule, req))
            .collect()
    }

    fn client_key(&self, rule: &Rule, req: &RequestHead<'_>) -> ClientKey {
        let mut key = self.key_head(rule);
        let part = key.len();
        let extractor = rule.key.as_ref().unwrap_or(&self.key);
        let mut client = ClientKey {
            rule: rule.name.clone(),
            key: Ok(Vec::new()),
            policy: rule.policy,
            pending: None,
        };
        if let Err(missing) = extractor.extract(req, &mut KeyWriter::new(&mut key)) {
            client.key = Err(missing);
            return client;
        }
        bound_key_part(&mut key, part, MAX_KEY_PART);
        let picked = match &rule.source {
            None => None,
            Some(PolicySource::Fn(f)) => f(req),
            Some(PolicySource::Resolver(r)) => r.resolve_now(&key[part..]).unwrap_or_else(|| {
                client.pending = Some((r.clone(), part));
                None
            }),
        };
        if let Some(policy) = picked {
            tag(rule, &policy, &mut key, part);
            client.policy = policy;
        }
        client.key = Ok(key);
        client
    }

    /// Asks the resolvers `client_keys` could not answer from a cache, as
    /// the layer asks them for a request: within its store timeout, the
    /// rule's own policy when one fails.
    async fn resolve_policies(&self, mut keys: Vec<ClientKey>) -> Vec<ClientKey> {
        for (k, rule) in keys.iter_mut().zip(&self.limits) {
            let (Some((resolver, part)), Ok(key)) = (k.pending.take(), &mut k.key) else {
                continue;
            };
            let call = resolver.resolve(&key[part..]);
            let answer = match self.settings.timeout {
                Some(limit) => tokio::time::timeout(limit, call)
                    .await
                    .unwrap_or_else(|_| Err(format!("timed out after {limit:?}").into())),
                None => call.await,
            };
            match answer {
                Ok(Some(policy)) => {
                    tag(rule, &policy, key, part);
                    k.policy = policy;
                }
                Ok(None) => {}
                Err(error) => tracing::warn!(target: "tower_throttle", %error,
                    "policy resolver failed: the rule's own policy is peeked"),
            }
        }
        keys
    }
}

/// Tags `key` (of `rule`, its key part starting at `part`) for `policy`
/// when that policy cannot share the rule's state: before the `:` that
/// ends the rule's namespace, where a request's key is tagged (see
/// [`crate::resolve`]).
fn tag(rule: &Rule, policy: &Policy, key: &mut Vec<u8>, part: usize) {
    let mut tag = Vec::new();
    if policy.write_state_tag(&rule.policy, &mut tag) {
        let at = part - 1;
        key.splice(at..at, tag);
    }
}

fn state(k: ClientKey, decision: Option<crate::decision::Decision>) -> RuleState {
    RuleState::new(k.rule, k.policy, k.key.map(Vec::into_boxed_slice), decision)
}
