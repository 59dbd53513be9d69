//! The tower layer, in tower's shape: [`RateLimitLayer`] makes [`RateLimit`]
//! services whose calls return a [`future::ResponseFuture`].

mod body;
mod check;
mod denial;
mod descriptors;
mod fields;
pub mod future;
#[expect(
    clippy::module_inception,
    reason = "tower's file names: layer.rs, service.rs, future.rs"
)]
mod layer;
mod service;

pub use body::ResponseBody;
pub use descriptors::{
    ClientIpKey, Composite, DescriptorSource, FixedKey, HeaderKey, HeaderMatch, RouteKey,
    RouteTemplate,
};
pub use fields::{HeaderMatcher, InvalidField, RequestField, ValueTest};
pub use layer::{Builder, RateLimitLayer};
pub use service::RateLimit;
pub use tollgate_policy::PolicyHandle;
