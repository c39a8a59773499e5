//! The unit tests of [`super`].

use super::*;
use crate::protocol::request::{Kind, Marked, script};

fn many(
    script_: &'static std::sync::LazyLock<crate::protocol::scripts::Script>,
    keys: &[&str],
) -> Request {
    let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
    script(Kind::Other, script_, script_, &keys, &[b"tok", b"1000"])
}

fn keys_of(request: &Request) -> Vec<Vec<u8>> {
    match request {
        Request::Script { keys, .. } => keys.to_vec(),
        Request::Durable { write, .. } => keys_of(write),
        _ => panic!("not a script"),
    }
}

#[test]
fn slots_are_computed_as_a_cluster_does() {
    // CRC16/XMODEM of "123456789" is 0x31C3; the rest from CLUSTER KEYSLOT.
    assert_eq!(slot(b"123456789"), 0x31C3);
    assert_eq!(slot(b"foo"), 12182);
    assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
    assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
    assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"), "an empty tag is no tag");
    assert_eq!(slot(b"{a}\xff"), slot(b"a"));
    for s in 0..16384u16 {
        assert_eq!(slot(slot_tag(s).as_bytes()), s);
    }
    assert!(SLOT_TAGS.iter().all(|t| t.len() <= 6));
}

#[test]
fn own_keys_move_into_the_lock_keys_slot() {
    let keys: [&[u8]; 3] = [b"app:x", b"app:x\xfffence", b"app:\xffcounter"];
    let request = script(
        Kind::Other,
        &scripts::FENCE_READ,
        &scripts::FENCE_READ,
        &keys,
        &[b"t"],
    );
    let local = localize(&request).expect("own keys to move");
    let moved = keys_of(&local);
    assert_eq!(moved[0], b"app:x");
    assert!(moved.iter().all(|k| slot(k) == slot(b"app:x")), "{moved:?}");
    assert_eq!(moved[2], in_slot(b"app:\xffcounter", slot(b"app:x")));
    let plain = many(&scripts::ACQUIRE_MANY, &["a", "b"]);
    assert!(localize(&plain).is_none());
}

#[test]
fn a_marked_set_names_the_marker_in_every_part() {
    let request = Request::Script {
        script: &scripts::ACQUIRE_MANY_MARKED,
        keys: vec![
            b"{a}1".to_vec(),
            b"{b}1".to_vec(),
            b"app:\xffgeneration".to_vec(),
        ]
        .into(),
        args: Arc::new([b"tok".to_vec(), b"1000".to_vec(), b"cand".to_vec()]),
        kind: Kind::Other,
        marked: Marked::Known,
    };
    let split = split(&request).unwrap().unwrap();
    assert_eq!(split.marked, Marked::Known);
    for part in &split.parts {
        let keys = keys_of(part);
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[1], b"app:\xffgeneration");
        let local = keys_of(&localize(part).unwrap());
        assert_eq!(slot(&local[1]), slot(&local[0]));
    }
    let young = Value::Array(vec![
        Value::Int(1),
        Value::Int(5),
        Value::BulkString(b"g1".to_vec()),
    ]);
    let old = Value::Array(vec![
        Value::Int(1),
        Value::Int(9000),
        Value::BulkString(b"g2".to_vec()),
    ]);
    assert_eq!(
        combine_marked(
            Combine::Acquire,
            Marked::Known,
            &[old.clone(), young.clone()]
        ),
        young
    );
    let known = Value::Array(vec![Value::Int(1)]);
    assert_eq!(
        combine_marked(
            Combine::Acquire,
            Marked::Known,
            &[known.clone(), known.clone()]
        ),
        known
    );
    assert!(acquired(&young));
}

#[test]
fn keys_of_one_slot_are_sent_as_they_are() {
    let one = many(&scripts::ACQUIRE_MANY, &["{a}x", "{a}y", "{a}z"]);
    assert!(split(&one).unwrap().is_none());
    let set = Request::Cmd(Arc::new(redis::cmd("SET")));
    assert!(split(&set).unwrap().is_none());
}

#[test]
fn keys_are_grouped_by_slot_in_order() {
    let request = many(&scripts::ACQUIRE_MANY, &["{a}1", "{b}1", "{a}2", "{c}1"]);
    let split = split(&request).unwrap().expect("three slots");
    assert_eq!(split.combine, Combine::Acquire);
    assert_eq!(split.token, b"tok");
    let groups: Vec<Vec<Vec<u8>>> = split.parts.iter().map(keys_of).collect();
    assert_eq!(
        groups,
        vec![
            vec![b"{a}1".to_vec(), b"{a}2".to_vec()],
            vec![b"{b}1".to_vec()],
            vec![b"{c}1".to_vec()],
        ]
    );
    let durable = request.durable(crate::protocol::durability::Durability::Replicas {
        replicas: 1,
        timeout: std::time::Duration::from_millis(10),
    });
    let parts = super::split(&durable).unwrap().unwrap().parts;
    assert!(parts.iter().all(|p| matches!(p, Request::Durable { .. })));
}

#[test]
fn fencing_over_several_slots_is_refused() {
    let request = many(&scripts::FENCE_WRITE, &["{a}1", "{b}1"]);
    assert!(matches!(split(&request), Err(NodeError::Unsupported(_))));
}

#[test]
fn the_node_agrees_only_where_every_part_did() {
    let held = Value::BulkString(b"other".to_vec());
    let one = Value::Int(1);
    assert_eq!(
        combine(Combine::Acquire, &[one.clone(), one.clone()]),
        Value::Int(1)
    );
    assert_eq!(
        combine(Combine::Acquire, &[one.clone(), held.clone()]),
        held
    );
    assert_eq!(
        combine(Combine::Extend, &[Value::Int(1), Value::Int(2)]),
        Value::Int(0)
    );
    assert_eq!(
        combine(Combine::Extend, &[Value::Int(2), Value::Int(2)]),
        Value::Int(2)
    );
    assert_eq!(
        combine(Combine::Check, &[Value::Int(1), Value::Int(0)]),
        Value::Int(0)
    );
    assert_eq!(
        combine(
            Combine::Unlock,
            &[Value::Int(0), Value::Int(2), Value::Int(1)]
        ),
        Value::Int(2)
    );
    let release = release(&many(&scripts::ACQUIRE_MANY, &["k"]), b"tok").unwrap();
    assert!(
        matches!(release, Request::Script { script, marked: Marked::No, .. } if std::ptr::eq(script, &*scripts::UNLOCK_MANY))
    );
}

#[test]
fn a_release_on_a_cluster_names_the_waiting_protocol_in_its_slot() {
    let parts = |request: &Request| match request {
        Request::Script {
            script, keys, args, ..
        } => (
            *script as *const crate::protocol::scripts::Script,
            keys.to_vec(),
            args.to_vec(),
        ),
        _ => panic!("a script"),
    };
    let tag = in_slot(b"", slot(b"k"));
    for (quiet, word) in [(false, &b"loud"[..]), (true, &b"quiet"[..])] {
        let release = super::super::unlock::request(&["k"], "tok", quiet);
        let (script, keys, args) = parts(&localize(&release).expect("sharded"));
        assert!(std::ptr::eq(script, &*scripts::UNLOCK_SHARD));
        assert_eq!(keys, vec![b"k".to_vec()], "only the lock key is declared");
        assert_eq!(args, vec![b"tok".to_vec(), word.to_vec(), tag.clone()]);
    }
    let check = super::super::handoff::request(vec![b"k".to_vec()], b"tok".to_vec());
    let (script, _, args) = parts(&localize(&check).expect("sharded"));
    assert!(std::ptr::eq(script, &*scripts::HANDOFF_CHECK_SHARD));
    assert_eq!(args, vec![b"tok".to_vec(), tag]);
    // A hand-off check over several slots is one per slot.
    let spread = super::super::handoff::request(
        vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()],
        b"tok".to_vec(),
    );
    assert_eq!(split(&spread).unwrap().expect("split").parts.len(), 3);
}

#[test]
fn wire_names_share_the_lock_keys_slot_and_come_back() {
    for key in ["k", "user:{42}:cart", "{}odd", "caf\u{e9}"] {
        let channel = crate::protocol::keys::release_channel(key);
        let own = crate::protocol::keys::successor_channel(&channel, "id");
        for name in [channel, own] {
            let wired = wire_name(&name);
            assert_eq!(slot(&wired), slot(key.as_bytes()), "{key}");
            assert_eq!(unwire_name(&wired), name.as_slice());
        }
    }
}
