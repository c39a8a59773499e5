//! The release gate of the waiting protocol, on one standalone node.
//!
//! A release publishes only when someone may wait. The gate was `PUBSUB
//! NUMSUB channel > 0` (one more call per release); the design modeled
//! here replaces it with a flag key F (`K ++ 0xFF ++ "waiting"`) that the
//! release deletes together with the lock key K in one `DEL`:
//!
//! - A manager's link, when a waiter of K first waits: (1) `SUBSCRIBE C`,
//!   awaited; (2) `SET F 1 PX lease`, awaited; (3) marks the node
//!   confirmed. The waiter then attempts `SET K NX` and, if refused,
//!   sleeps until a release message comes.
//! - While the manager has a waiter of K it renews F; when its last waiter
//!   leaves it unsubscribes (F is left to expire).
//! - The loud release (atomic): `GET K == T`, then `DEL K F`; if F was
//!   absent, return (the cheap path); otherwise, if `NUMSUB C > 0`,
//!   re-create F and publish (to every subscriber, or to one named
//!   subscriber). The quiet release (a failed attempt's) deletes K only.
//!
//! Properties ([`GateModel`]'s `properties`):
//! - `gate open for every confirmed waiter`: every loud release made while
//!   a manager has a confirmed, subscribed waiter that sleeps or attempts
//!   takes the publish path;
//! - `no stranded sleeper`: never is K free after a loud release while a
//!   confirmed subscribed waiter sleeps with no wake-up on its way and
//!   nobody else is awake to take K (after a quiet release or an expiry
//!   the waiters' timers are the designed wake-up, and are left out).
//!
//! Simplifications (README.md, "The release gate"): one waiter per
//! manager; a manager's pending release messages collapse to one (the one
//! delivery comes after every publish it stands for); an awaited
//! `SUBSCRIBE` and `UNSUBSCRIBE` take effect at once; renewals keep F
//! while the manager waits (a renewal re-creates a missing F at any later
//! step); F's lease ends at any step once no manager renews it (earlier
//! than the node would end it: more behaviours); the named successor is
//! any subscriber.

use std::fmt::Write as _;

use stateright::{Model, Path, Property};

use crate::{Run, Search, Traced, check_model};

/// Who a loud release's publish wakes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Wake {
    /// `PUBLISH C`: every subscribed manager.
    Broadcast,
    /// One subscriber named by the release (any of them); the others stay
    /// asleep and need F to remain for the next release.
    Named,
}

/// The configuration: the design, its budgets, and the planted faults.
#[derive(Clone, Debug)]
pub struct GateCfg {
    pub managers: usize,
    /// Waits each manager may begin (one waiter at a time).
    pub waits: u8,
    /// Acquisitions by the holder client, the first being its hold at the
    /// start: the newcomer that may take a free K between.
    pub holder_turns: u8,
    pub wake: Wake,
    /// The holder client may release quietly (a failed attempt's release).
    pub quiet: bool,
    /// The holder client may crash: its K expires (budget), and the
    /// sleeping waiters wake by their timers (they know its PTTL).
    pub expiries: u8,
    /// A sleeping waiter may give up (budget); its manager unsubscribes.
    pub leaves: u8,
    /// The releaser's hand-off check after a named release: if K is still
    /// free, publish to every subscriber.
    pub handoff_check: bool,
    /// The slow path re-creates F (planted violation 1: false).
    pub recreate: bool,
    /// Step 3 waits for step 2's reply (planted violation 2: false, the
    /// waiter is confirmed as soon as `SET F` is sent).
    pub confirm_after_f: bool,
    /// `SET F` is sent once `SUBSCRIBE` is acknowledged (false: both are
    /// sent at once, and the node may run them in either order).
    pub subscribe_awaited: bool,
    /// A release message that arrives while the waiter's attempt is in
    /// flight is kept, and a refusal then attempts again (false: dropped).
    pub keep_early_wake: bool,
    /// Nemesis (planted violation 3): F lapses while renewed (renewals lost,
    /// or the node paused longer than the lease).
    pub lapses: u8,
    /// A link that sees a renewal's reply come later than the lease allows
    /// (or not at all) sets F again and then wakes its waiters to attempt
    /// again, as after step 3 (not in the brief's design: the suggested
    /// remedy for the lapse).
    pub relink: bool,
    /// Managers are interchangeable: states are kept with the managers in
    /// a canonical order (traces then renumber them from step to step).
    pub symmetry: bool,
}

impl GateCfg {
    /// The design with every behaviour this model has, for 3 managers.
    pub fn design(wake: Wake) -> Self {
        GateCfg {
            managers: 3,
            waits: 2,
            holder_turns: 3,
            wake,
            quiet: true,
            expiries: 1,
            leaves: 1,
            handoff_check: true,
            recreate: true,
            confirm_after_f: true,
            subscribe_awaited: true,
            keep_early_wake: true,
            lapses: 0,
            relink: false,
            symmetry: true,
        }
    }

    /// Planted violation 1: the slow path deletes F and publishes without
    /// re-creating it.
    pub fn no_recreate(wake: Wake) -> Self {
        GateCfg {
            recreate: false,
            ..Self::small(wake)
        }
    }

    /// Planted violation 2: the link confirms before `SET F` lands.
    pub fn confirm_early() -> Self {
        GateCfg {
            confirm_after_f: false,
            ..Self::small(Wake::Broadcast)
        }
    }

    /// Planted violation 3 (the documented degradation): F lapses once
    /// while a manager is subscribed and renewing.
    pub fn lapse() -> Self {
        GateCfg {
            lapses: 1,
            ..Self::small(Wake::Broadcast)
        }
    }

    /// Step 2 not ordered after step 1 on the node.
    pub fn subscribe_unawaited() -> Self {
        GateCfg {
            subscribe_awaited: false,
            ..Self::small(Wake::Broadcast)
        }
    }

    /// A wake-up that overtakes the attempt's refusal is dropped.
    pub fn drop_early_wake() -> Self {
        GateCfg {
            keep_early_wake: false,
            ..Self::small(Wake::Broadcast)
        }
    }

    /// A named release without the releaser's hand-off check, and a named
    /// waiter that gives up.
    pub fn named_without_check() -> Self {
        GateCfg {
            handoff_check: false,
            ..Self::small(Wake::Named)
        }
    }

    /// The lapse with the suggested remedy: the link notices the late
    /// renewal, sets F again and wakes its waiters.
    pub fn lapse_relink() -> Self {
        GateCfg {
            relink: true,
            ..Self::lapse()
        }
    }

    /// The size of the planted runs: 2 managers, no symmetry (readable
    /// traces), the design otherwise.
    fn small(wake: Wake) -> Self {
        GateCfg {
            managers: 2,
            symmetry: false,
            ..Self::design(wake)
        }
    }
}

/// The holder client's id as K's owner (managers are `0..managers`).
pub const HOLDER: u8 = u8::MAX;

/// A waiter's attempt `SET K token NX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Attempt {
    /// Sent; the node has not run it.
    Sent,
    /// Run: K was free and is ours; the reply is on its way.
    Granted,
    /// Run: K was held; the reply is on its way.
    Refused,
}

/// A manager's one waiter of K.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Waiter {
    Idle,
    /// Waiting for its node to be confirmed (steps 1 to 3).
    Linking,
    Attempting(Attempt),
    Sleeping,
    /// Took K; its wait is over (the manager unsubscribed).
    Holding,
}

/// The link's `SET F 1 PX lease` (step 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetF {
    Idle,
    Sent,
    /// The node ran it; the reply is on its way.
    Ran,
}

/// One manager: its waiter and its link to the node.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mgr {
    pub waiter: Waiter,
    pub waits: u8,
    /// `SUBSCRIBE C` sent, not yet run (only when it is not awaited).
    pub subscribing: bool,
    pub set_f: SetF,
    /// Step 3 done for the current wait.
    pub confirmed: bool,
    /// Its `SET F` ran during the current wait: its renewals keep F.
    pub renewing: bool,
    /// A release message is on its way on the subscription connection.
    pub inbox: bool,
    /// A release message came while the attempt was in flight.
    pub woken: bool,
    /// The current wait was resumed by a release message (a witness).
    pub roused: bool,
    /// F lapsed while this link renewed it, and the link has not yet seen
    /// its late renewal (`GateCfg::relink`).
    pub lapsed: bool,
}

/// How K was last freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Freed {
    /// Not yet.
    Never,
    /// A loud release found F absent: the cheap path, no publish.
    Skipped,
    /// A loud release found F, and nobody subscribed: F deleted.
    Unsubscribed,
    /// A loud release published.
    Published,
    /// A quiet release.
    Quiet,
    /// The holder's K expired.
    Expired,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GateState {
    /// K's owner: a manager, or [`HOLDER`].
    pub k: Option<u8>,
    pub f: bool,
    /// The managers subscribed to C (a bit each): `NUMSUB C`.
    pub subs: u8,
    /// A named release's hand-off check is still to run.
    pub handoff: bool,
    pub mgrs: Vec<Mgr>,
    pub turns: u8,
    pub expiries: u8,
    pub leaves: u8,
    pub lapses: u8,
    pub freed: Freed,
    /// A loud release skipped the publish while a confirmed subscribed
    /// waiter slept or attempted: the violation of the gate property.
    pub missed: Option<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum GateAction {
    /// A waiter of K begins to wait: step 1 (and step 2 sent).
    Wait(u8),
    /// The node runs a `SUBSCRIBE` that was not awaited.
    Subscribe(u8),
    /// The node runs the link's `SET F`.
    SetF(u8),
    /// The `SET F` reply reaches the link: step 3.
    SetFReply(u8),
    /// The node runs the waiter's attempt.
    Attempt(u8),
    /// The attempt's reply reaches the waiter.
    AttemptReply(u8),
    /// A release message reaches the manager.
    Message(u8),
    /// A loud release by K's owner, naming `named` (the named variant).
    Release { by: u8, named: Option<u8> },
    /// The holder client's quiet release.
    QuietRelease,
    /// The holder client takes a free K.
    Acquire,
    /// The holder client's K expires; every sleeping waiter's timer fires.
    Expire,
    /// F's lease ends (nobody renews it).
    FExpires,
    /// Nemesis: F lapses although renewed.
    Lapse,
    /// The link sees its renewal late: sets F again, then wakes its waiter.
    Relink(u8),
    /// A renewal re-creates a missing F.
    Renew(u8),
    /// A sleeping waiter gives up; its manager unsubscribes.
    Leave(u8),
    /// The releaser's hand-off check after a named release.
    HandoffCheck,
}

/// The model.
#[derive(Clone, Debug)]
pub struct GateModel {
    pub cfg: GateCfg,
}

/// The property the design relies on.
pub const GATE_OPEN: &str = "gate open for every confirmed waiter";
/// Nobody left asleep by a loud release with nobody awake.
pub const NOT_STRANDED: &str = "no stranded sleeper";

impl GateModel {
    pub fn new(cfg: GateCfg) -> Self {
        GateModel { cfg }
    }

    /// The waiters a loud release must publish for: confirmed, subscribed,
    /// and sleeping or attempting.
    fn must_wake(s: &GateState) -> Option<u8> {
        (0..s.mgrs.len() as u8).find(|&m| {
            let g = &s.mgrs[m as usize];
            g.confirmed
                && s.subs & bit(m) != 0
                && matches!(g.waiter, Waiter::Sleeping | Waiter::Attempting(_))
        })
    }

    /// Whether someone will take K, or wake a sleeper, without a timer: a
    /// waiter about to attempt, a wake-up on its way to a waiter, or a
    /// hand-off check to run.
    fn awake(s: &GateState) -> bool {
        s.handoff
            || s.mgrs.iter().any(|g| g.lapsed)
            || s.mgrs.iter().any(|g| match g.waiter {
                Waiter::Linking | Waiter::Attempting(Attempt::Sent | Attempt::Granted) => true,
                Waiter::Attempting(Attempt::Refused) => g.woken || g.inbox,
                Waiter::Sleeping => g.inbox,
                Waiter::Idle | Waiter::Holding => false,
            })
    }

    /// K free since a loud release, a confirmed subscribed waiter asleep,
    /// and nobody awake.
    pub fn stranded(s: &GateState) -> bool {
        s.k.is_none()
            && matches!(
                s.freed,
                Freed::Skipped | Freed::Unsubscribed | Freed::Published
            )
            && !Self::awake(s)
            && (0..s.mgrs.len() as u8).any(|m| {
                let g = &s.mgrs[m as usize];
                g.waiter == Waiter::Sleeping && g.confirmed && s.subs & bit(m) != 0
            })
    }

    /// The manager's wait ends (it took K or gave up): it unsubscribes,
    /// and stops renewing F (F stays until its lease ends).
    fn end_wait(s: &mut GateState, m: u8) {
        s.subs &= !bit(m);
        let g = &mut s.mgrs[m as usize];
        g.confirmed = false;
        g.renewing = false;
        g.woken = false;
        g.lapsed = false;
        g.roused = g.roused && g.waiter == Waiter::Holding;
    }

    /// Step 3 when its conditions hold: subscribed, and (with
    /// `confirm_after_f`) `SET F` acknowledged.
    fn confirm(s: &mut GateState, m: u8) {
        let g = &mut s.mgrs[m as usize];
        if g.waiter == Waiter::Linking && !g.subscribing && g.set_f == SetF::Idle {
            g.confirmed = true;
            g.waiter = Waiter::Attempting(Attempt::Sent);
        }
    }

    fn publish(s: &mut GateState, to: u8) {
        for m in 0..s.mgrs.len() as u8 {
            if to & bit(m) != 0 {
                s.mgrs[m as usize].inbox = true;
            }
        }
    }

    fn step(&self, s: &GateState, a: &GateAction) -> GateState {
        let cfg = &self.cfg;
        let mut s = s.clone();
        match *a {
            GateAction::Wait(m) => {
                let g = &mut s.mgrs[m as usize];
                g.waits += 1;
                g.waiter = Waiter::Linking;
                g.roused = false;
                g.set_f = SetF::Sent;
                if cfg.subscribe_awaited {
                    s.subs |= bit(m);
                } else {
                    g.subscribing = true;
                }
                if !cfg.confirm_after_f {
                    // Planted: confirmed with `SET F` still on its way.
                    g.confirmed = true;
                    g.waiter = Waiter::Attempting(Attempt::Sent);
                }
            }
            GateAction::Subscribe(m) => {
                s.mgrs[m as usize].subscribing = false;
                s.subs |= bit(m);
                Self::confirm(&mut s, m);
            }
            GateAction::SetF(m) => {
                s.f = true;
                let g = &mut s.mgrs[m as usize];
                g.set_f = SetF::Ran;
                g.renewing = !matches!(g.waiter, Waiter::Idle | Waiter::Holding);
            }
            GateAction::SetFReply(m) => {
                s.mgrs[m as usize].set_f = SetF::Idle;
                Self::confirm(&mut s, m);
            }
            GateAction::Attempt(m) => {
                let granted = s.k.is_none();
                if granted {
                    s.k = Some(m);
                }
                s.mgrs[m as usize].waiter = Waiter::Attempting(if granted {
                    Attempt::Granted
                } else {
                    Attempt::Refused
                });
            }
            GateAction::AttemptReply(m) => {
                let g = &mut s.mgrs[m as usize];
                match g.waiter {
                    Waiter::Attempting(Attempt::Granted) => {
                        g.waiter = Waiter::Holding;
                        Self::end_wait(&mut s, m);
                    }
                    _ if g.woken => {
                        g.woken = false;
                        g.waiter = Waiter::Attempting(Attempt::Sent);
                    }
                    _ => g.waiter = Waiter::Sleeping,
                }
            }
            GateAction::Message(m) => {
                let g = &mut s.mgrs[m as usize];
                g.inbox = false;
                match g.waiter {
                    Waiter::Sleeping => {
                        g.waiter = Waiter::Attempting(Attempt::Sent);
                        g.roused = true;
                    }
                    Waiter::Attempting(_) if cfg.keep_early_wake => g.woken = true,
                    // Linking attempts anyway once confirmed; Idle and
                    // Holding have no waiter.
                    _ => {}
                }
            }
            GateAction::Release { by, named } => {
                let must = Self::must_wake(&s);
                s.k = None;
                let f_existed = s.f;
                s.f = false;
                let published = f_existed && s.subs != 0;
                if published {
                    if cfg.recreate {
                        s.f = true;
                    }
                    match named {
                        Some(n) => {
                            Self::publish(&mut s, bit(n));
                            s.handoff = cfg.handoff_check;
                        }
                        None => {
                            let all = s.subs;
                            Self::publish(&mut s, all);
                        }
                    }
                }
                s.freed = match (f_existed, published) {
                    (false, _) => Freed::Skipped,
                    (true, false) => Freed::Unsubscribed,
                    (true, true) => Freed::Published,
                };
                if !published && s.missed.is_none() {
                    s.missed = must;
                }
                if by != HOLDER {
                    s.mgrs[by as usize].waiter = Waiter::Idle;
                    s.mgrs[by as usize].roused = false;
                }
            }
            GateAction::QuietRelease => {
                s.k = None;
                s.freed = Freed::Quiet;
            }
            GateAction::Acquire => {
                s.k = Some(HOLDER);
                s.turns += 1;
            }
            GateAction::Expire => {
                s.k = None;
                s.expiries += 1;
                s.freed = Freed::Expired;
                for g in &mut s.mgrs {
                    if g.waiter == Waiter::Sleeping {
                        g.waiter = Waiter::Attempting(Attempt::Sent);
                    }
                }
            }
            GateAction::FExpires => s.f = false,
            GateAction::Lapse => {
                s.f = false;
                s.lapses += 1;
                if cfg.relink {
                    for g in &mut s.mgrs {
                        g.lapsed = g.renewing;
                    }
                }
            }
            GateAction::Relink(m) => {
                s.f = true;
                let g = &mut s.mgrs[m as usize];
                g.lapsed = false;
                match g.waiter {
                    Waiter::Sleeping => g.waiter = Waiter::Attempting(Attempt::Sent),
                    Waiter::Attempting(_) => g.woken = true,
                    _ => {}
                }
            }
            GateAction::Renew(_) => s.f = true,
            GateAction::Leave(m) => {
                s.leaves += 1;
                s.mgrs[m as usize].waiter = Waiter::Idle;
                Self::end_wait(&mut s, m);
            }
            GateAction::HandoffCheck => {
                s.handoff = false;
                if s.k.is_none() {
                    let all = s.subs;
                    Self::publish(&mut s, all);
                }
            }
        }
        if cfg.symmetry {
            canonical(&mut s);
        }
        s
    }

    /// One state, readably: `K=m1 F subs={m0,m2} | m0 sleeping, confirmed…`.
    pub fn summary(&self, s: &GateState) -> String {
        let mut out = String::new();
        let _ = write!(out, "K={} F={} subs={{", who(s.k), u8::from(s.f));
        let subs: Vec<String> = (0..s.mgrs.len() as u8)
            .filter(|&m| s.subs & bit(m) != 0)
            .map(|m| format!("m{m}"))
            .collect();
        let _ = write!(out, "{}}}", subs.join(","));
        if s.handoff {
            out.push_str(" handoff-check-pending");
        }
        for (m, g) in s.mgrs.iter().enumerate() {
            let _ = write!(out, " | m{m} {:?}", g.waiter);
            for (on, name) in [
                (g.subscribing, "subscribing"),
                (g.set_f == SetF::Sent, "SET-F-sent"),
                (g.set_f == SetF::Ran, "SET-F-reply-due"),
                (g.confirmed, "confirmed"),
                (g.renewing, "renewing"),
                (g.inbox, "MESSAGE-due"),
                (g.woken, "woken"),
                (g.lapsed, "lapsed"),
            ] {
                if on {
                    let _ = write!(out, " {name}");
                }
            }
        }
        if let Some(m) = s.missed {
            let _ = write!(out, " || MISSED m{m}");
        }
        out
    }
}

fn bit(m: u8) -> u8 {
    1 << m
}

/// Puts the managers of `s` in a canonical order (symmetry reduction): by
/// their state, whether they subscribe, hold K, or were missed; the
/// indices in K, the subscriber set and `missed` follow.
fn canonical(s: &mut GateState) {
    let n = s.mgrs.len() as u8;
    let key = |m: u8| {
        (
            &s.mgrs[m as usize],
            s.subs & bit(m) != 0,
            s.k == Some(m),
            s.missed == Some(m),
        )
    };
    let mut order: Vec<u8> = (0..n).collect();
    order.sort_by(|&a, &b| key(a).cmp(&key(b)));
    if order.iter().enumerate().all(|(k, &m)| k as u8 == m) {
        return;
    }
    // order[k] = the old index of the manager that goes to position k.
    let mut new_of_old = vec![0u8; n as usize];
    for (k, &m) in order.iter().enumerate() {
        new_of_old[m as usize] = k as u8;
    }
    let renumber = |m: Option<u8>| match m {
        Some(m) if m != HOLDER => Some(new_of_old[m as usize]),
        other => other,
    };
    s.k = renumber(s.k);
    s.missed = renumber(s.missed);
    s.subs = (0..n)
        .filter(|&m| s.subs & bit(m) != 0)
        .fold(0, |acc, m| acc | bit(new_of_old[m as usize]));
    s.mgrs = order.iter().map(|&m| s.mgrs[m as usize].clone()).collect();
}

fn who(k: Option<u8>) -> String {
    match k {
        None => "free".into(),
        Some(HOLDER) => "holder".into(),
        Some(m) => format!("m{m}"),
    }
}

impl Model for GateModel {
    type State = GateState;
    type Action = GateAction;

    fn init_states(&self) -> Vec<GateState> {
        let idle = Mgr {
            waiter: Waiter::Idle,
            waits: 0,
            subscribing: false,
            set_f: SetF::Idle,
            confirmed: false,
            renewing: false,
            inbox: false,
            woken: false,
            roused: false,
            lapsed: false,
        };
        vec![GateState {
            k: Some(HOLDER),
            f: false,
            subs: 0,
            handoff: false,
            mgrs: vec![idle; self.cfg.managers],
            turns: 1,
            expiries: 0,
            leaves: 0,
            lapses: 0,
            freed: Freed::Never,
            missed: None,
        }]
    }

    fn actions(&self, s: &GateState, out: &mut Vec<GateAction>) {
        let cfg = &self.cfg;
        match s.k {
            None if s.turns < cfg.holder_turns => out.push(GateAction::Acquire),
            Some(HOLDER) => {
                self.releases(s, HOLDER, out);
                if cfg.quiet {
                    out.push(GateAction::QuietRelease);
                }
                if s.expiries < cfg.expiries {
                    out.push(GateAction::Expire);
                }
            }
            _ => {}
        }
        if s.f {
            if s.mgrs.iter().all(|g| !g.renewing) {
                out.push(GateAction::FExpires);
            } else if s.lapses < cfg.lapses {
                out.push(GateAction::Lapse);
            }
        }
        if s.handoff {
            out.push(GateAction::HandoffCheck);
        }
        for (i, g) in s.mgrs.iter().enumerate() {
            let m = i as u8;
            if g.inbox {
                out.push(GateAction::Message(m));
            }
            if g.subscribing {
                out.push(GateAction::Subscribe(m));
            }
            match g.set_f {
                SetF::Sent => out.push(GateAction::SetF(m)),
                SetF::Ran => out.push(GateAction::SetFReply(m)),
                SetF::Idle => {}
            }
            if g.renewing && !s.f {
                out.push(GateAction::Renew(m));
            }
            if g.lapsed {
                out.push(GateAction::Relink(m));
            }
            match g.waiter {
                Waiter::Idle if g.waits < cfg.waits && g.set_f == SetF::Idle && !g.subscribing => {
                    out.push(GateAction::Wait(m));
                }
                Waiter::Attempting(Attempt::Sent) => out.push(GateAction::Attempt(m)),
                Waiter::Attempting(_) => out.push(GateAction::AttemptReply(m)),
                Waiter::Sleeping if s.leaves < cfg.leaves => out.push(GateAction::Leave(m)),
                Waiter::Holding => self.releases(s, m, out),
                _ => {}
            }
        }
    }

    fn next_state(&self, s: &GateState, a: GateAction) -> Option<GateState> {
        Some(self.step(s, &a))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(GATE_OPEN, |_: &GateModel, s: &GateState| s.missed.is_none()),
            Property::always(NOT_STRANDED, |_: &GateModel, s: &GateState| {
                !GateModel::stranded(s)
            }),
            Property::sometimes("a release publishes", |_: &GateModel, s: &GateState| {
                s.freed == Freed::Published
            }),
            Property::sometimes(
                "a release takes the cheap path",
                |_: &GateModel, s: &GateState| s.freed == Freed::Skipped,
            ),
            Property::sometimes(
                "a woken waiter takes the lock",
                |_: &GateModel, s: &GateState| {
                    s.mgrs
                        .iter()
                        .any(|g| g.roused && g.waiter == Waiter::Holding)
                },
            ),
        ]
    }
}

impl GateModel {
    /// The loud releases K's owner `by` may make: one, or (named) one per
    /// subscriber the release may name.
    fn releases(&self, s: &GateState, by: u8, out: &mut Vec<GateAction>) {
        let named: Vec<u8> = (0..s.mgrs.len() as u8)
            .filter(|&m| s.subs & bit(m) != 0)
            .collect();
        if self.cfg.wake == Wake::Named && s.f && !named.is_empty() {
            for n in named {
                out.push(GateAction::Release { by, named: Some(n) });
            }
        } else {
            out.push(GateAction::Release { by, named: None });
        }
    }
}

impl Traced for GateModel {
    fn trace(&self, path: &Path<GateState, GateAction>) -> String {
        let steps = path.clone().into_vec();
        let mut out = String::new();
        if let Some((s, _)) = steps.first() {
            let _ = writeln!(out, "  init: {}", self.summary(s));
        }
        for w in steps.windows(2) {
            if let Some(a) = &w[0].1 {
                let _ = writeln!(out, "  {a:?}");
                let _ = writeln!(out, "      {}", self.summary(&w[1].0));
            }
        }
        out
    }
}

/// Runs the checker on the gate model (see [`crate::check`]).
pub fn check(cfg: GateCfg, search: Search, threads: usize, stop_at: Option<&'static str>) -> Run {
    check_model(GateModel::new(cfg), search, threads, stop_at)
}
