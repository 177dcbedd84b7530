//! Where a rule's key comes from, as a file writes it.

use std::sync::Arc;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

use crate::key::{
    BearerToken, Cidr, ClientIp, ForwardedHeader, Global, GrpcMethod, HeaderKey, KeyExtractor, Or,
    PeerIp, UriPath,
};

/// Where a rule's key comes from.
///
/// ```yaml
/// key: peer_ip
/// key: { header: x-user-id }
/// key: { client_ip: { trust: [10.0.0.0/8], header: forwarded } }
/// key: { first_of: [bearer_token, peer_ip] }
/// ```
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum KeyConfig {
    /// One key for everyone ([`Global`]).
    Global,
    /// The peer's address ([`PeerIp`]).
    PeerIp,
    /// The client's address behind trusted proxies ([`ClientIp`]).
    ClientIp(ClientIpConfig),
    /// A hash of the bearer token ([`BearerToken`]).
    BearerToken,
    /// A request header's value ([`HeaderKey`]).
    Header(#[serde(deserialize_with = "header_name")] http::HeaderName),
    /// The request path ([`UriPath::full`]).
    UriPath,
    /// The gRPC method ([`GrpcMethod`]).
    GrpcMethod,
    /// The first of these keys that the request has ([`Or`]).
    FirstOf(#[serde(deserialize_with = "some_keys")] Vec<KeyConfig>),
    /// An extractor the application registered under this name
    /// ([`Extractors`](super::Extractors)): a user id from a request
    /// extension, say.
    Extractor(String),
}

/// [`ClientIp`]'s settings.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientIpConfig {
    /// Proxies whose forwarding headers are believed (CIDRs).
    #[serde(default, deserialize_with = "cidrs")]
    pub trust: Vec<Cidr>,
    /// The header they set (default `x_forwarded_for`; also `forwarded`,
    /// `x_real_ip`, `cf_connecting_ip`, `true_client_ip`, `fly_client_ip`, …).
    #[serde(default)]
    pub header: Option<ForwardedHeader>,
}

impl KeyConfig {
    /// The extractor this describes; errs on a name `extractors` lacks.
    pub(super) fn extractor(
        &self,
        extractors: &super::Extractors,
    ) -> Result<Arc<dyn KeyExtractor>, String> {
        Ok(match self {
            KeyConfig::Extractor(name) => extractors.get(name)?,
            KeyConfig::Global => Arc::new(Global),
            KeyConfig::PeerIp => Arc::new(PeerIp::new()),
            KeyConfig::ClientIp(c) => {
                let mut ip = ClientIp::new().trust_all(c.trust.iter().copied());
                if let Some(header) = c.header {
                    ip = ip.header(header);
                }
                Arc::new(ip)
            }
            KeyConfig::BearerToken => Arc::new(BearerToken),
            KeyConfig::Header(name) => Arc::new(HeaderKey::new(name.clone())),
            KeyConfig::UriPath => Arc::new(UriPath::full()),
            KeyConfig::GrpcMethod => Arc::new(GrpcMethod::default()),
            KeyConfig::FirstOf(keys) => {
                let keys: Vec<_> = (keys.iter().rev())
                    .map(|k| k.extractor(extractors))
                    .collect::<Result<_, _>>()?;
                let mut keys = keys.into_iter();
                let last = keys.next().unwrap_or_else(|| Arc::new(Global));
                keys.fold(last, |chain, key| Arc::new(Or::new(key, chain)))
            }
        })
    }
}

fn header_name<'de, D: Deserializer<'de>>(d: D) -> Result<http::HeaderName, D::Error> {
    let name = String::deserialize(d)?;
    http::HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| D::Error::custom(format_args!("{name:?} is not a header name")))
}

fn cidrs<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Cidr>, D::Error> {
    Vec::<String>::deserialize(d)?
        .iter()
        .map(|range| {
            range
                .parse()
                .map_err(|e| D::Error::custom(format_args!("{range:?} is not a CIDR: {e}")))
        })
        .collect()
}

fn some_keys<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<KeyConfig>, D::Error> {
    let keys = Vec::<KeyConfig>::deserialize(d)?;
    if keys.is_empty() {
        return Err(D::Error::custom("`first_of` needs at least one key"));
    }
    Ok(keys)
}
