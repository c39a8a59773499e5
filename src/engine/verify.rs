//! The remote check of a lock: whether a quorum holds its token now. See
//! [`Redlock::verify`](crate::Redlock::verify).

use std::sync::Arc;

use crate::engine::Inner;
use crate::engine::lock::Lock;
use crate::engine::round::{self, Round, Until};
use crate::protocol::error::Error;
use crate::protocol::quorum::{Ask, Outcome};
use crate::protocol::request::check;

impl Inner {
    pub(crate) async fn verify(self: &Arc<Self>, lock: &Lock) -> Result<bool, Error> {
        self.configured()?;
        let request = check::request(&self.generation, &lock.key_list(), &lock.token);
        let after = self.extensions.behind(&lock.token, &lock.in_flight);
        let Round { tally, .. } = round::round(
            self,
            None,
            Ask::Owned,
            Until::Decided,
            request,
            &after,
            check::read(&self.generation),
        )
        .await;
        self.note(&tally);
        match tally.outcome() {
            Outcome::Quorum => Ok(true),
            Outcome::Refused => Ok(false),
            _ => Err(tally.into_error(&lock.label())),
        }
    }
}
