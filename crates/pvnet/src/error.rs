//! The `pvnet` command's errors: what went wrong, with its cause. `main` prints them as
//! `pvnet: error: <message>` (with the cause chain) and exits with status 1.

use std::fmt::Display;
use std::io;

/// An error of a `pvnet` command.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An argument or configuration value the command cannot use.
    #[error("{0}")]
    Usage(String),
    /// A run did not do what it must (a child process failed, counts did not add up).
    #[error("{0}")]
    Failed(String),
    /// A system call or file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done (a path, a socket, an operation).
        what: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// pvnet's frontend failed (negotiation, memory, or a queue rule the backend broke).
    #[error(transparent)]
    Frontend(#[from] pvnet_vhost::frontend::Error),
    /// A report from a child or a control socket was not the JSON expected.
    #[error("unreadable report: {0}")]
    Json(#[from] serde_json::Error),
}

/// Result with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl From<io::Error> for Error {
    fn from(source: io::Error) -> Self {
        Error::Io {
            what: "I/O".into(),
            source,
        }
    }
}

/// A value the command cannot use.
pub fn usage(msg: impl Into<String>) -> Error {
    Error::Usage(msg.into())
}

/// A run that did not do what it must.
pub fn failed(msg: impl Into<String>) -> Error {
    Error::Failed(msg.into())
}

/// Wraps an I/O error with what was being done: `.map_err(io(path.display()))?`.
pub fn io(what: impl Display) -> impl FnOnce(io::Error) -> Error {
    move |source| Error::Io {
        what: what.to_string(),
        source,
    }
}
