//! What kind of failure an [`Error`] is: whether retrying can help, and
//! whether the lock is held elsewhere.

use crate::protocol::error::Error;

/// The kind of an [`Error`], for callers that decide what to do next
/// without matching every variant: see [`Error::kind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Another holder has the lock, or may have it
    /// ([`Error::Conflict`]). Retrying later can help.
    HeldElsewhere,
    /// The nodes could not settle it now: too few answered
    /// ([`Error::NoQuorum`]), the quorum came too late
    /// ([`Error::ValidityExpired`]), a fencing token could not be proven
    /// ([`Error::FencingUnproven`]). Retrying can help.
    Unavailable,
    /// The lock is no longer ours ([`Error::NotHeld`], [`Error::LockLost`]):
    /// take a new one.
    Lost,
    /// The nodes answered with errors that retrying cannot fix
    /// ([`Error::Redis`]: a key of another type, a read-only replica, a
    /// missing permission, a failed authentication).
    Refused,
    /// The manager's configuration: the node list or a setting.
    Config,
    /// The call's arguments: a ttl, the resource names or a token.
    Argument,
    /// The operating system ([`Error::Entropy`]).
    System,
}

impl Error {
    /// The kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Conflict { .. } => ErrorKind::HeldElsewhere,
            Error::NoQuorum { .. }
            | Error::ValidityExpired { .. }
            | Error::FencingUnproven { .. } => ErrorKind::Unavailable,
            Error::NotHeld { .. } | Error::LockLost { .. } => ErrorKind::Lost,
            Error::Redis { .. } => ErrorKind::Refused,
            Error::EmptyNodeList
            | Error::InvalidNodeAddress { .. }
            | Error::DuplicateNode { .. }
            | Error::InvalidSetting { .. } => ErrorKind::Config,
            Error::ZeroTtl
            | Error::TtlNotAboveDrift { .. }
            | Error::TtlTooLarge { .. }
            | Error::TtlTooShortToRenew { .. }
            | Error::TtlAboveRestartGuard { .. }
            | Error::EmptyResource
            | Error::NoResources
            | Error::DuplicateResource { .. }
            | Error::TooManyResources { .. }
            | Error::InvalidToken { .. } => ErrorKind::Argument,
            Error::Entropy(_) => ErrorKind::System,
        }
    }

    /// Whether the same call may succeed if made again later: the lock was
    /// held elsewhere, or the nodes could not settle it now
    /// ([`ErrorKind::HeldElsewhere`], [`ErrorKind::Unavailable`]). `lock`
    /// already retries these within its patience; a caller that gets one
    /// may try again after a pause. Errors of configuration, arguments and
    /// refusals (`WRONGTYPE`, `READONLY`, `NOPERM`) are not retryable.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind(),
            ErrorKind::HeldElsewhere | ErrorKind::Unavailable
        )
    }

    /// Whether another holder has the lock, or may have it
    /// ([`Error::Conflict`]): the resource is busy, nothing is wrong.
    pub fn is_held_elsewhere(&self) -> bool {
        self.kind() == ErrorKind::HeldElsewhere
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_their_questions() {
        let conflict = Error::Conflict {
            resource: "r".into(),
            held: 3,
            required: 3,
            nodes: 5,
            failures: Vec::new(),
        };
        assert!(conflict.is_held_elsewhere() && conflict.is_retryable());
        let none = Error::NoQuorum {
            resource: "r".into(),
            granted: 1,
            required: 3,
            failures: Vec::new(),
        };
        assert!(!none.is_held_elsewhere() && none.is_retryable());
        assert_eq!(none.kind(), ErrorKind::Unavailable);
        let lost = Error::NotHeld {
            resource: "r".into(),
        };
        assert_eq!(lost.kind(), ErrorKind::Lost);
        assert!(!lost.is_retryable());
        for e in [
            Error::ZeroTtl,
            Error::EmptyResource,
            Error::InvalidToken { reason: "empty" },
        ] {
            assert_eq!(e.kind(), ErrorKind::Argument, "{e}");
            assert!(!e.is_retryable() && !e.is_held_elsewhere());
        }
        assert_eq!(Error::EmptyNodeList.kind(), ErrorKind::Config);
        assert_eq!(Error::Entropy("x".into()).kind(), ErrorKind::System);
    }
}
