//! [`ShedLayer`].

use std::sync::Arc;

use tower_layer::Layer;

use super::{Shed, Shedder};

/// Wraps services in [`Shed`], all sharing one [`Shedder`] (one learned
/// limit for what they protect together).
///
/// ```
/// use std::sync::Arc;
/// use tollgate_http::{ShedConfig, ShedLayer, Shedder};
///
/// let shedder = Arc::new(Shedder::new(ShedConfig::default())?);
/// let layer = ShedLayer::new(Arc::clone(&shedder));
/// // `shedder.snapshot()` shows the learned limit, in flight and sheds.
/// # let _ = layer;
/// # Ok::<(), tollgate_http::ShedConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ShedLayer {
    shedder: Arc<Shedder>,
}

impl ShedLayer {
    /// A layer deciding with `shedder`.
    pub fn new(shedder: Arc<Shedder>) -> Self {
        Self { shedder }
    }
}

impl<S> Layer<S> for ShedLayer {
    type Service = Shed<S>;

    fn layer(&self, inner: S) -> Shed<S> {
        Shed::new(inner, Arc::clone(&self.shedder))
    }
}
