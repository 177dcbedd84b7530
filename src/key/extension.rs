//! Keys from typed request extensions, set by an authentication layer.

use std::fmt::{self, Display, Write as _};
use std::marker::PhantomData;

use super::{KeyExtractor, KeyWriter, MissingKey, RequestHead};

const NO_EXTENSION: MissingKey =
    MissingKey::new("no authenticated identity (the auth layer set no extension)");

/// A value of type `T` that an earlier layer (typically authentication:
/// "user id from a token") inserted in the request extensions, written with
/// its `Display` impl.
///
/// ```
/// use std::fmt;
/// use tower_throttle::key::{FromExtension, KeyExtractor, KeyWriter, RequestHead};
///
/// #[derive(Clone)]
/// struct UserId(u64);
/// impl fmt::Display for UserId {
///     fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
///         write!(f, "u{}", self.0)
///     }
/// }
///
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(UserId(42)); // done by your auth middleware
/// let mut key = Vec::new();
/// FromExtension::<UserId>::new().extract(&RequestHead::new(&req), &mut KeyWriter::new(&mut key))?;
/// assert_eq!(key, b"u42");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct FromExtension<T> {
    _t: PhantomData<fn() -> T>,
}

impl<T: Display + Send + Sync + 'static> FromExtension<T> {
    /// Reads the `T` extension.
    pub fn new() -> Self {
        FromExtension { _t: PhantomData }
    }
}

impl<T: Send + Sync + 'static> FromExtension<T> {
    /// Reads the `T` extension and keys by what `f` returns, e.g. one field
    /// of a user struct.
    pub fn map<F, D>(f: F) -> FromExtensionWith<T, F>
    where
        F: Fn(&T) -> D + Send + Sync + 'static,
        D: Display,
    {
        FromExtensionWith::new(f)
    }
}

impl<T: Display + Send + Sync + 'static> Default for FromExtension<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for FromExtension<T> {
    fn clone(&self) -> Self {
        FromExtension { _t: PhantomData }
    }
}

impl<T> fmt::Debug for FromExtension<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FromExtension<{}>", std::any::type_name::<T>())
    }
}

impl<T: Display + Send + Sync + 'static> KeyExtractor for FromExtension<T> {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyWriter<'_>) -> Result<(), MissingKey> {
        let value = req.extensions().get::<T>().ok_or(NO_EXTENSION)?;
        let _ = write!(key, "{value}");
        Ok(())
    }
}

/// The `T` extension mapped by a function, e.g. `|user: &CurrentUser| user.id`.
///
/// ```
/// use tower_throttle::key::FromExtension;
///
/// #[derive(Clone)]
/// struct CurrentUser { id: u64, name: String }
/// let key = FromExtension::<CurrentUser>::map(|u: &CurrentUser| u.id);
/// # let _ = key;
/// ```
pub struct FromExtensionWith<T, F> {
    f: F,
    _t: PhantomData<fn() -> T>,
}

impl<T, F> FromExtensionWith<T, F> {
    /// Keys by `f` applied to the `T` extension.
    pub fn new(f: F) -> Self {
        FromExtensionWith { f, _t: PhantomData }
    }
}

impl<T, F: Clone> Clone for FromExtensionWith<T, F> {
    fn clone(&self) -> Self {
        FromExtensionWith::new(self.f.clone())
    }
}

impl<T, F> fmt::Debug for FromExtensionWith<T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FromExtensionWith<{}>", std::any::type_name::<T>())
    }
}

impl<T, F, D> KeyExtractor for FromExtensionWith<T, F>
where
    T: Send + Sync + 'static,
    F: Fn(&T) -> D + Send + Sync + 'static,
    D: Display,
{
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyWriter<'_>) -> Result<(), MissingKey> {
        let value = req.extensions().get::<T>().ok_or(NO_EXTENSION)?;
        let _ = write!(key, "{}", (self.f)(value));
        Ok(())
    }
}
