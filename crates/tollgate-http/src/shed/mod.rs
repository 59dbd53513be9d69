//! Load shedding by priority tier in front of a service, on an adaptive
//! concurrency limit: [`ShedLayer`] makes [`Shed`] services whose calls
//! return a [`future::ResponseFuture`]; one [`Shedder`] keeps the learned
//! limit and the requests in flight for every clone.

pub mod future;
mod layer;
mod service;
mod shedder;

pub use layer::ShedLayer;
pub use service::Shed;
pub use shedder::{InFlight, Overloaded, ShedConfig, ShedConfigError, Shedder, Snapshot};
pub(crate) use shedder::{overloaded, overloaded_body, overloaded_grpc};
pub use tollgate_core::{Thresholds, ThresholdsError, Tier};
