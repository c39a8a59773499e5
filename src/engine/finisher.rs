//! The finisher: one task per manager and runtime that finishes the
//! requests a round left pending when it stopped at a quorum (see
//! [`round`](crate::engine::round)), for rounds run outside a task.
//!
//! A round run in a task spawns a task for its leftover: from a worker,
//! the spawn usually goes to that worker's own queue and wakes nobody
//! ([`Finishers::finish`] says where it does not). Outside a task (from
//! `Runtime::block_on`'s thread, or a plain thread in `Handle::block_on`),
//! a spawn on a multi-thread runtime goes through the runtime's shared
//! queue and unparks a parked worker, on the caller's time; such a round
//! hands its leftover to the finisher instead, polling it with the
//! finisher task's waker, so that its replies wake the finisher (on the
//! worker whose connection read them), and the hand-off itself wakes
//! nobody (see [`fresh`]). The finisher is not used from tasks: one task
//! and one lock for every round of the runtime cost 64 tasks on two
//! workers a few per cent of their throughput against a spawn each
//! ([`Finishers::finish`]).
//!
//! # Worst days
//! - **Runtimes.** A leftover holds timers of the runtime it was made in,
//!   which must not be polled once that runtime shut down: each runtime
//!   has its own finisher, found by its [runtime id](tokio::runtime::Id). A
//!   runtime that shuts down drops its finisher and with it every leftover
//!   (each marks its request settled as it is dropped, as the spawned task
//!   did); its entry is pruned when a new runtime comes (a later runtime
//!   that reuses its id finds the entry without a task and spawns one).
//! - **Many leftovers** (a paused node leaves one per round for the node
//!   timeout): they sit in a `FuturesUnordered`, which polls only those
//!   that woke.
//! - **A leftover that panics** is dropped alone; the others go on.
//! - **The manager dropped.** Its finishers end once their leftovers have
//!   (each is bounded by the timeouts); none is left parked for ever.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::runtime::{Handle, Id};

/// A round's pending requests, as one future.
pub(crate) type Leftover = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The finishers of one manager, one per runtime it ran rounds in.
#[derive(Default)]
pub(crate) struct Finishers {
    by_runtime: Mutex<Vec<(Id, Arc<Shared>)>>,
}

impl std::fmt::Debug for Finishers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Finishers")
            .field("runtimes", &lock(&self.by_runtime).len())
            .finish()
    }
}

/// What a finisher task shares with the rounds that hand it work.
struct Shared {
    state: Mutex<State>,
}

struct State {
    /// The leftovers, beside one that never finishes (see [`fresh`]).
    leftovers: FuturesUnordered<Leftover>,
    /// The task's waker, once it ran: the hand-off polls with it.
    waker: Option<Waker>,
    /// Whether the task was spawned and not dropped yet.
    running: bool,
    /// Set when the manager is dropped: the task ends once it has no
    /// leftovers.
    closed: bool,
}

/// A set of leftovers holding one future that never finishes and is never
/// woken. `FuturesUnordered` wakes its own waker when one call polled every
/// future in it (so as not to starve other tasks): without that future, a
/// hand-off to an idle finisher (one new leftover, polled alone) would wake
/// the finisher task from the caller's thread, the cost the finisher is
/// there to save.
fn fresh() -> FuturesUnordered<Leftover> {
    let set = FuturesUnordered::new();
    set.push(Box::pin(std::future::pending()) as Leftover);
    set
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poison means a leftover panicked while polled; the state is still
    // consistent (a set of futures and flags).
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

impl State {
    fn new() -> State {
        State {
            leftovers: fresh(),
            waker: None,
            running: false,
            closed: false,
        }
    }

    /// Polls the leftovers that woke (and those new) with `cx`, dropping
    /// each that finished, until none is ready.
    fn poll(&mut self, cx: &mut Context<'_>) {
        while let Poll::Ready(Some(())) = self.leftovers.poll_next_unpin(cx) {}
    }

    /// Whether no leftover is pending.
    fn idle(&self) -> bool {
        self.leftovers.len() == 1
    }
}

impl Finishers {
    /// Has `leftover` finished: by a task of its own when called from a
    /// task, by this runtime's finisher otherwise (from `block_on`'s thread,
    /// say). Must be called from within a Tokio runtime.
    ///
    /// From a task on a worker, a spawn is the cheaper of the two: it
    /// usually goes to the worker's own next-task slot and wakes nobody, and
    /// the leftover's replies wake its own task, on the worker whose
    /// connection read them. The finisher, one task and one lock for every
    /// round of the runtime, cost 64 tasks on two workers about 6 % of
    /// their throughput (scenario 5 of the benchmark's profile loop, by
    /// turns). Outside a task, a spawn on a multi-thread runtime would go
    /// through the runtime's shared queue and unpark a worker, on the
    /// caller's time, which the hand-off does not.
    ///
    /// "In a task" is what Tokio can tell ([`tokio::task::try_id`]), not
    /// "on a worker": the closures of `spawn_blocking` (and
    /// `Handle::block_on` inside them), `block_in_place` and the tasks of
    /// a `LocalSet` driven from a multi-thread runtime's `block_on` run as
    /// tasks off the workers, and their rounds spawn through the shared
    /// queue, as every round did before the finisher. Correct either way;
    /// only the cost differs.
    ///
    /// A task that blocks its worker (`futures::executor::block_on` inside
    /// a task, say) may hold its leftover in the worker's next-task slot,
    /// which other workers do not steal from: a later step on that lock,
    /// in the same blocked call, then waits for the leftover for ever.
    /// Blocking a worker stalls any Tokio code so; the finisher had the
    /// same hazard for a runtime's first hand-off.
    ///
    /// A leftover that panics ends alone either way (a spawned one is
    /// caught here too, so that a runtime built to shut down on an
    /// unhandled panic does not).
    pub(crate) fn finish<F>(&self, leftover: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if tokio::task::try_id().is_some() {
            tokio::spawn(
                std::panic::AssertUnwindSafe(leftover)
                    .catch_unwind()
                    .map(|_| ()),
            );
        } else {
            self.hand_off(Box::pin(leftover));
        }
    }

    /// Has `leftover` finished by this runtime's finisher, spawning it if
    /// there is none. Must be called from within a Tokio runtime.
    ///
    /// The hand-off polls the finisher's set with the task's waker: the new
    /// leftover, and any other that woke since the task last ran (each
    /// answers at once). A leftover that panics is dropped alone.
    pub(crate) fn hand_off(&self, leftover: Leftover) {
        let leftover: Leftover = Box::pin(
            std::panic::AssertUnwindSafe(leftover)
                .catch_unwind()
                .map(|_| ()),
        );
        let id = Handle::current().id();
        let (shared, spawn) = {
            let mut by_runtime = lock(&self.by_runtime);
            let shared = match by_runtime.iter().position(|(runtime, _)| *runtime == id) {
                Some(at) => by_runtime[at].1.clone(),
                None => {
                    // Entries of runtimes that shut down (their task was
                    // dropped) are of no use any more.
                    by_runtime.retain(|(_, shared)| lock(&shared.state).running);
                    let shared = Arc::new(Shared {
                        state: Mutex::new(State::new()),
                    });
                    by_runtime.push((id, shared.clone()));
                    shared
                }
            };
            // Decided with the entry still in the list, so that no other
            // hand-off prunes it between the decision and the spawn.
            let mut state = lock(&shared.state);
            let spawn = !state.running;
            state.running = true;
            drop(state);
            (shared, spawn)
        };
        let mut state = lock(&shared.state);
        state.leftovers.push(leftover);
        if !spawn {
            // Polled here with the task's waker, the new leftover wakes
            // the task when it is ready. A task that has not run yet polls
            // it on its first run. A task that was dropped meanwhile (its
            // runtime shutting down) took the set and left a new one: the
            // leftover is dropped with the state's next task, or here.
            if let Some(waker) = state.waker.clone() {
                state.poll(&mut Context::from_waker(&waker));
            }
            if state.running {
                return;
            }
            state.running = true;
        }
        drop(state);
        // A new entry, or one whose task was dropped (its runtime is
        // shutting down: the new task is dropped as it is spawned, with
        // the leftovers).
        let guard = Running(shared.clone());
        tokio::spawn(async move {
            let guard = guard;
            std::future::poll_fn(|cx| {
                let mut state = lock(&guard.0.state);
                if !state
                    .waker
                    .as_ref()
                    .is_some_and(|waker| waker.will_wake(cx.waker()))
                {
                    state.waker = Some(cx.waker().clone());
                }
                state.poll(cx);
                if state.closed && state.idle() {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
        });
    }
}

impl Drop for Finishers {
    fn drop(&mut self) {
        for (_, shared) in lock(&self.by_runtime).drain(..) {
            let mut state = lock(&shared.state);
            state.closed = true;
            if let Some(waker) = state.waker.take() {
                waker.wake();
            }
        }
    }
}

/// Owned by the finisher task (also before its first poll): marks the
/// finisher gone when the task ends or is dropped with its runtime, and
/// drops the leftovers then, outside the lock.
struct Running(Arc<Shared>);

impl Drop for Running {
    fn drop(&mut self) {
        let leftovers = {
            let mut state = lock(&self.0.state);
            state.running = false;
            state.waker = None;
            std::mem::replace(&mut state.leftovers, fresh())
        };
        drop(leftovers);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// A leftover that counts its completion after `delay`.
    fn counted(delay: Duration, done: &Arc<AtomicUsize>) -> Leftover {
        let done = done.clone();
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            done.fetch_add(1, Ordering::SeqCst);
        })
    }

    async fn until(done: &AtomicUsize, count: usize) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while done.load(Ordering::SeqCst) < count {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("the finisher finished every leftover");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn leftovers_handed_off_finish_including_those_after_the_first() {
        let finishers = Finishers::default();
        let done = Arc::new(AtomicUsize::new(0));
        for i in 0..200u64 {
            finishers.hand_off(counted(Duration::from_millis(i % 7), &done));
            if i % 50 == 0 {
                tokio::task::yield_now().await;
            }
        }
        until(&done, 200).await;
        // One task for every hand-off of this runtime.
        assert_eq!(finishers.by_runtime.lock().unwrap().len(), 1);
    }

    /// A finisher with nothing to do is parked: a leftover handed to it
    /// then must still wake it when it is ready (the hand-off polls it with
    /// the task's waker; pushed alone, it would wait for ever).
    #[test]
    fn a_leftover_handed_to_an_idle_finisher_finishes() {
        for flavor in ["current_thread", "multi_thread"] {
            let runtime = match flavor {
                "current_thread" => tokio::runtime::Builder::new_current_thread(),
                _ => tokio::runtime::Builder::new_multi_thread(),
            }
            .enable_all()
            .build()
            .unwrap();
            let finishers = Finishers::default();
            let done = Arc::new(AtomicUsize::new(0));
            runtime.block_on(async {
                for round in 1..=3 {
                    finishers.hand_off(counted(Duration::from_millis(5), &done));
                    until(&done, round).await;
                    // Parked, its one leftover done.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            });
        }
    }

    /// A waker that counts its wake-ups.
    struct Count(AtomicUsize);
    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The hand-off to an idle finisher polls the new leftover alone;
    /// `FuturesUnordered` would wake the finisher's waker for it (from the
    /// caller's thread) but for the future that never finishes.
    #[test]
    fn a_hand_off_to_an_idle_finisher_wakes_nobody() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut state = State::new();
        // The task's first poll, with nothing to do, polls the future
        // that never finishes, alone: that wakes the task once (on its own
        // thread), and never again, since that future is never woken.
        state.poll(&mut Context::from_waker(&waker));
        count.0.store(0, Ordering::SeqCst);
        for _ in 0..3 {
            state.leftovers.push(Box::pin(std::future::pending()));
            state.poll(&mut Context::from_waker(&waker));
        }
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "woken at the hand-off");
        assert!(!state.idle());
    }

    /// From `block_on`'s thread (not a worker), on both kinds of runtime,
    /// including hand-offs before the task first ran.
    #[test]
    fn leftovers_from_block_on_finish() {
        for multi in [false, true] {
            let runtime = if multi {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap()
            } else {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
            };
            let finishers = Finishers::default();
            let done = Arc::new(AtomicUsize::new(0));
            runtime.block_on(async {
                // Two before the task can have run on this runtime's
                // thread (no await between).
                finishers.hand_off(counted(Duration::from_millis(2), &done));
                finishers.hand_off(counted(Duration::from_millis(3), &done));
                for _ in 0..98 {
                    finishers.hand_off(counted(Duration::from_millis(2), &done));
                    tokio::time::sleep(Duration::from_micros(300)).await;
                }
                until(&done, 100).await;
            });
        }
    }

    /// A leftover that panics is dropped alone: the others finish, and
    /// the finisher takes new ones.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leftover_that_panics_is_dropped_alone() {
        let finishers = Finishers::default();
        let done = Arc::new(AtomicUsize::new(0));
        finishers.hand_off(counted(Duration::from_millis(30), &done));
        tokio::task::yield_now().await;
        finishers.hand_off(Box::pin(async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            panic!("a leftover that panics (planted by the test)");
        }));
        tokio::time::sleep(Duration::from_millis(10)).await;
        finishers.hand_off(counted(Duration::from_millis(1), &done));
        until(&done, 2).await;
    }

    /// A runtime that shut down dropped its finisher and its leftovers
    /// (whose timers no other runtime may poll), while another runtime's
    /// finisher goes on; a later runtime gets a finisher of its own.
    #[test]
    fn each_runtime_has_its_own_finisher() {
        struct CountDrop(Arc<AtomicUsize>);
        impl Drop for CountDrop {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let finishers = Finishers::default();
        let done = Arc::new(AtomicUsize::new(0));
        let dropped = Arc::new(AtomicUsize::new(0));
        let long = |dropped: &Arc<AtomicUsize>| -> Leftover {
            let count = CountDrop(dropped.clone());
            Box::pin(async move {
                let _count = count;
                tokio::time::sleep(Duration::from_secs(3600)).await;
            })
        };
        let kept = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        kept.block_on(async {
            finishers.hand_off(long(&dropped));
            tokio::task::yield_now().await;
        });
        let short = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        short.block_on(async {
            finishers.hand_off(long(&dropped));
            tokio::task::yield_now().await;
        });
        drop(short);
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            1,
            "dropped with its runtime"
        );
        kept.block_on(async {
            finishers.hand_off(counted(Duration::from_millis(1), &done));
            until(&done, 1).await;
        });
        let later = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        later.block_on(async {
            finishers.hand_off(counted(Duration::from_millis(1), &done));
            until(&done, 2).await;
        });
        // The shut-down runtime's entry was pruned when the later one came.
        assert_eq!(finishers.by_runtime.lock().unwrap().len(), 2);
        drop(kept);
        assert_eq!(dropped.load(Ordering::SeqCst), 2);
    }

    /// Dropping the manager ends its finisher: at once when it has
    /// nothing left (the drop wakes it), or once its leftovers finished.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_task_ends_with_the_manager() {
        for leftover_pending in [false, true] {
            let finishers = Finishers::default();
            let done = Arc::new(AtomicUsize::new(0));
            finishers.hand_off(counted(Duration::from_millis(20), &done));
            let shared = finishers.by_runtime.lock().unwrap()[0].1.clone();
            if !leftover_pending {
                until(&done, 1).await;
                // Parked, with nothing to do.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            drop(finishers);
            until(&done, 1).await;
            tokio::time::timeout(Duration::from_secs(10), async {
                while lock(&shared.state).running {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
            .await
            .expect("the finisher ended");
        }
    }
}
