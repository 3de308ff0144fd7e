use super::*;
use proptest::prelude::*;

fn obs<'a>(session: &'a str, intent: &'a str, tool: &'a str, status: u8) -> Observation<'a> {
    Observation {
        session_id: session.as_bytes(),
        intent: intent.as_bytes(),
        tool_call: tool.as_bytes(),
        status,
        agent_id: Some(b"agent-1"),
    }
}

/// An owned copy of [`Scored`], for assertions.
#[derive(Debug, Clone, PartialEq)]
struct Owned {
    score: f64,
    severity: Severity,
    previous: Option<Severity>,
    window_len: usize,
    detail: Option<OwnedDetail>,
}

#[derive(Debug, Clone, PartialEq)]
struct OwnedDetail {
    agent_id: Option<String>,
    repeated: Tuple,
    occurrences: usize,
}

fn rec(store: &Store, o: &Observation<'_>, settings: &Settings) -> Result<Owned, Error> {
    store.record(o, settings, |s| Owned {
        score: s.score,
        severity: s.severity,
        previous: s.previous,
        window_len: s.window_len,
        detail: s.detail.map(|d| OwnedDetail {
            agent_id: d.agent_id.map(str::to_owned),
            repeated: d.repeated.clone(),
            occurrences: d.occurrences,
        }),
    })
}

fn record(store: &Store, o: Observation<'_>) -> Owned {
    rec(store, &o, &Settings::default()).unwrap()
}

#[test]
fn uc_0250_s1_sixth_tuple_evicts_the_oldest() {
    let store = Store::new(4, 100);
    for i in 0..5 {
        record(&store, obs("sess-abc", "plan", &format!("tool-{i}"), 0));
    }
    let scored = record(&store, obs("sess-abc", "execute", "run_shell", 1));
    assert_eq!(scored.window_len, 5);
    assert_eq!(scored.score, 1.0);
    let view = store.session(b"sess-abc").unwrap();
    assert_eq!(view.window.len(), 5);
    assert!(view.window.iter().all(|t| &*t.tool_call != "tool-0"));
    assert_eq!(&*view.window[4].tool_call, "run_shell");
}

#[test]
fn uc_0250_s2_partial_window() {
    let store = Store::new(4, 100);
    record(&store, obs("sess-new", "a", "t", 0));
    record(&store, obs("sess-new", "b", "t", 0));
    let third = record(&store, obs("sess-new", "c", "t", 0));
    assert_eq!((third.score, third.window_len), (1.0, 3));
}

#[test]
fn fr_9_3_pure_loop_scores_point_two_and_is_a_loop() {
    let store = Store::new(4, 100);
    let mut last = None;
    for _ in 0..5 {
        last = Some(record(&store, obs("s", "search", "read_file", 1)));
    }
    let last = last.unwrap();
    assert_eq!(last.score, 0.2);
    assert_eq!(last.severity, Severity::Loop);
    assert_eq!(last.previous, Some(Severity::Warning));
    let detail = last.detail.unwrap();
    assert_eq!(detail.agent_id.as_deref(), Some("agent-1"));
    assert_eq!(&*detail.repeated.tool_call, "read_file");
    assert_eq!(detail.occurrences, 5);
}

#[test]
fn statuses_tell_tuples_apart() {
    let store = Store::new(1, 10);
    record(&store, obs("s", "i", "t", 0));
    let second = record(&store, obs("s", "i", "t", 1));
    assert_eq!(second.score, 1.0);
}

#[test]
fn normal_steps_carry_no_detail_until_recovery() {
    let store = Store::new(1, 10);
    assert!(record(&store, obs("s", "a", "t", 0)).detail.is_none());
    // two identical → 0.5: still normal
    let r = record(&store, obs("s", "a", "t", 0));
    assert_eq!((r.score, r.severity), (0.5, Severity::Normal));
    assert!(r.detail.is_none());
    let w = record(&store, obs("s", "a", "t", 0));
    assert_eq!(w.severity, Severity::Warning);
    assert!(w.detail.is_some());
    let settings = Settings {
        window_size: 1,
        ..Settings::default()
    };
    let recovered = rec(&store, &obs("s", "b", "t", 0), &settings).unwrap();
    assert_eq!(recovered.severity, Severity::Normal);
    assert_eq!(recovered.previous, Some(Severity::Warning));
    assert!(recovered.detail.is_some(), "recovery is broadcast");
}

#[test]
fn agent_is_remembered_and_can_change() {
    let store = Store::new(1, 10);
    let mut o = obs("s", "a", "t", 0);
    rec(&store, &o, &Settings::default()).unwrap();
    o.agent_id = None;
    rec(&store, &o, &Settings::default()).unwrap();
    assert_eq!(
        store.session(b"s").unwrap().agent_id.as_deref(),
        Some("agent-1")
    );
    o.agent_id = Some(b"agent-2");
    rec(&store, &o, &Settings::default()).unwrap();
    assert_eq!(
        store.session(b"s").unwrap().agent_id.as_deref(),
        Some("agent-2")
    );
}

#[test]
fn unknown_agent_stays_unknown() {
    let store = Store::new(1, 10);
    let mut o = obs("s", "a", "t", 0);
    o.agent_id = None;
    for _ in 0..5 {
        rec(&store, &o, &Settings::default()).unwrap();
    }
    let r = rec(&store, &o, &Settings::default()).unwrap();
    assert_eq!(r.severity, Severity::Loop);
    assert_eq!(r.detail.unwrap().agent_id, None);
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let store = Store::new(1, 10);
    let long = "x".repeat(MAX_FIELD_BYTES + 1);
    let long_id = "s".repeat(MAX_ID_BYTES + 1);
    let cases: Vec<(Observation<'_>, Error)> = vec![
        (obs("", "a", "t", 0), Error::InvalidSessionId),
        (obs(&long_id, "a", "t", 0), Error::InvalidSessionId),
        (obs("s", &long, "t", 0), Error::FieldTooLong),
        (obs("s", "a", &long, 0), Error::FieldTooLong),
        (
            Observation {
                intent: b"\xff\xfe",
                ..obs("s", "a", "t", 0)
            },
            Error::InvalidUtf8,
        ),
        (
            Observation {
                session_id: b"\xc3\x28",
                ..obs("s", "a", "t", 0)
            },
            Error::InvalidUtf8,
        ),
        (
            Observation {
                agent_id: Some(b""),
                ..obs("s", "a", "t", 0)
            },
            Error::InvalidAgentId,
        ),
    ];
    for (o, expected) in cases {
        assert_eq!(rec(&store, &o, &Settings::default()), Err(expected));
    }
    let zero = Settings {
        window_size: 0,
        ..Settings::default()
    };
    assert_eq!(
        rec(&store, &obs("s", "a", "t", 0), &zero),
        Err(Error::InvalidWindowSize)
    );
    assert!(store.is_empty());
    assert_eq!(store.interned_tuples(), 0);
}

#[test]
fn exactly_max_sizes_are_accepted() {
    let store = Store::new(1, 10);
    let field = "x".repeat(MAX_FIELD_BYTES);
    let id = "s".repeat(MAX_ID_BYTES);
    assert!(rec(&store, &obs(&id, &field, &field, 0), &Settings::default()).is_ok());
}

#[test]
fn ttl_sweep_drops_idle_sessions_only() {
    let store = Store::new(2, 100);
    store.tick(1_000);
    record(&store, obs("old", "a", "t", 0));
    store.tick(9_000);
    record(&store, obs("new", "a", "t", 0));
    assert_eq!(store.sweep(10_000, 5_000), 1);
    assert!(store.session(b"old").is_none());
    assert!(store.session(b"new").is_some());
    assert_eq!(store.stats().expired, 1);
}

#[test]
fn evicted_session_restarts_with_a_fresh_window() {
    let store = Store::new(1, 10);
    for _ in 0..5 {
        record(&store, obs("s", "a", "t", 0));
    }
    assert!(store.forget(b"s"));
    let r = record(&store, obs("s", "a", "t", 0));
    assert_eq!((r.score, r.window_len, r.previous), (1.0, 1, None));
}

#[test]
fn list_returns_the_most_recently_seen_first() {
    let store = Store::new(4, 100);
    store.tick(10);
    record(&store, obs("a", "x", "t", 0));
    store.tick(20);
    record(&store, obs("b", "x", "t", 0));
    record(&store, obs("b", "x", "t", 0));
    let listed = store.list(10);
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0].session_id, "b");
    assert_eq!(listed[0].score, 0.5);
    assert_eq!(listed[0].last_seen_ms, 20);
    assert_eq!(listed[1].agent_id.as_deref(), Some("agent-1"));
    assert_eq!(store.list(1).len(), 1);
}

#[test]
fn capacity_evicts_the_least_recently_seen() {
    let store = Store::new(1, 3);
    record(&store, obs("a", "x", "t", 0));
    record(&store, obs("b", "x", "t", 0));
    record(&store, obs("c", "x", "t", 0));
    record(&store, obs("a", "x", "t", 0)); // a is now the most recent
    record(&store, obs("d", "x", "t", 0)); // evicts b
    assert!(store.session(b"b").is_none());
    for s in [b"a", b"c", b"d"] {
        assert!(store.session(s).is_some());
    }
    assert_eq!(store.stats().evicted_over_capacity, 1);
}

#[test]
fn interned_tuples_are_freed_with_their_windows() {
    let store = Store::new(4, 1000);
    for s in 0..50 {
        for t in 0..7 {
            record(&store, obs(&format!("s{s}"), "i", &format!("t{t}"), 0));
        }
    }
    assert!(store.interned_tuples() > 0);
    assert_eq!(store.sweep(i64::MAX, 0), 50);
    assert_eq!(store.interned_tuples(), 0);
}

#[test]
fn two_threads_record_without_losing_steps() {
    let store = std::sync::Arc::new(Store::new(16, 100_000));
    let handles: Vec<_> = (0..2)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..10_000 {
                    let session = format!("t{t}-s{}", i % 100);
                    record(&store, obs(&session, "i", "tool", 0));
                }
            })
        })
        .collect();
    handles.into_iter().for_each(|h| h.join().unwrap());
    assert_eq!(store.len(), 200);
    let view = store.session(b"t1-s7").unwrap();
    assert_eq!(view.window.len(), 5);
}

proptest! {
    /// With fewer than 64 sessions per shard the batch is one, so the store is an
    /// exact LRU: the survivors are the `cap` most recently seen sessions.
    #[test]
    fn eviction_order_is_least_recently_seen_first(
        accesses in prop::collection::vec(0u8..20, 1..200),
        cap in 1usize..10,
    ) {
        let store = Store::new(1, cap);
        let mut recency: Vec<u8> = Vec::new();
        for s in &accesses {
            let id = format!("s{s}");
            record(&store, obs(&id, "i", "t", 0));
            recency.retain(|x| x != s);
            recency.push(*s);
        }
        let expected: std::collections::BTreeSet<u8> =
            recency.iter().rev().take(cap).copied().collect();
        for s in 0u8..20 {
            let present = store.session(format!("s{s}").as_bytes()).is_some();
            prop_assert_eq!(present, expected.contains(&s), "session s{}", s);
        }
    }

    #[test]
    fn store_window_matches_a_model(
        steps in prop::collection::vec((0u8..3, 0u8..4), 1..60),
        size in 1usize..8,
    ) {
        let store = Store::new(2, 100);
        let settings = Settings { window_size: size, ..Settings::default() };
        let mut model: Vec<(u8, u8)> = Vec::new();
        for (session, tool) in steps {
            let sid = format!("s{session}");
            let tool_name = format!("t{tool}");
            let scored = rec(&store, &obs(&sid, "i", &tool_name, 0), &settings).unwrap();
            model.push((session, tool));
            let window: Vec<u8> = model.iter().filter(|(s, _)| *s == session).map(|(_, t)| *t).collect();
            let window = &window[window.len().saturating_sub(size)..];
            let distinct: std::collections::HashSet<_> = window.iter().collect();
            prop_assert_eq!(scored.window_len, window.len());
            prop_assert_eq!(scored.score, round4(distinct.len() as f64 / window.len() as f64));
        }
    }
}

/// Tuples and agents are interned with their strings inline up to 30 bytes and on the
/// heap beyond: either side of the boundary, strings alike up to their last byte are
/// different tuples and different agents, and come back whole.
#[test]
fn fr_9_2_inline_and_heap_strings_are_told_apart_at_their_boundary() {
    let store = Store::new(1, 100);
    let settings = Settings {
        window_size: 8,
        ..Settings::default()
    };
    let at_30 = "i".repeat(30);
    let at_31 = "i".repeat(31);
    let other_30 = format!("{}j", "i".repeat(29));
    let other_31 = format!("{}j", "i".repeat(30));
    let texts = [&at_30, &at_31, &other_30, &other_31];
    for (k, text) in texts.iter().enumerate() {
        let o = Observation {
            agent_id: Some(text.as_bytes()),
            ..obs("sess-inline", text, text, 0)
        };
        let scored = rec(&store, &o, &settings).unwrap();
        // Every tuple so far is new: nothing repeats.
        assert_eq!(scored.window_len, k + 1);
        assert_eq!(scored.score, 1.0);
        assert_eq!(
            store.session(b"sess-inline").unwrap().agent_id.as_deref(),
            Some(text.as_str()),
            "the agent changed to {text}"
        );
    }
    let view = store.session(b"sess-inline").unwrap();
    let seen: Vec<(&str, &str)> = view
        .window
        .iter()
        .map(|t| (&*t.intent, &*t.tool_call))
        .collect();
    let want: Vec<(&str, &str)> = texts.iter().map(|t| (t.as_str(), t.as_str())).collect();
    assert_eq!(seen, want);
    // The same strings again are the same tuples: two of each now.
    for text in texts {
        rec(&store, &obs("sess-inline", text, text, 0), &settings).unwrap();
    }
    let scored = rec(&store, &obs("sess-inline", &at_31, &at_31, 0), &settings).unwrap();
    assert_eq!(scored.window_len, 8);
    assert_eq!(scored.score, 0.5);
    assert_eq!(store.interned_tuples(), 4);
}

#[test]
fn fr_9_2_sessions_of_one_agent_share_its_interned_id() {
    let store = Store::new(1, 100);
    let settings = Settings::default();
    for (session, agent) in [
        ("s1", "agent-a"),
        ("s2", "agent-a"),
        ("s3", &*"b".repeat(40)),
    ] {
        let o = Observation {
            agent_id: Some(agent.as_bytes()),
            ..obs(session, "plan", "read_file", 0)
        };
        rec(&store, &o, &settings).unwrap();
    }
    rec(
        &store,
        &Observation {
            agent_id: Some("b".repeat(40).as_bytes()),
            ..obs("s4", "plan", "read_file", 0)
        },
        &settings,
    )
    .unwrap();
    // One entry an agent, whichever session names it, inline or not.
    assert_eq!(store.interned_agents(), 2);
    assert_eq!(
        store.session(b"s2").unwrap().agent_id.as_deref(),
        Some("agent-a")
    );
}

#[test]
fn a_session_hashed_as_the_keyed_stores_hash_it_is_found_by_every_call() {
    // The scoring call hashes a session id once (`key_hash`) for this store and the
    // keyed stores: a step recorded with that hash and one recorded without it land in
    // the same window, which the reads and forget find.
    let store = Store::new(8, 100);
    let settings = Settings::default();
    for id in ["sess-1", "sess-2", &"s".repeat(40)] {
        let first = obs(id, "plan", "read_file", 0);
        let hashed = store
            .record_hashed(&first, key_hash(id.as_bytes()), &settings, |s| s.window_len)
            .unwrap();
        assert_eq!(hashed, 1);
        assert_eq!(record(&store, obs(id, "plan", "grep", 0)).window_len, 2);
        let third = obs(id, "plan", "edit", 0);
        let len = store
            .record_hashed(&third, key_hash(id.as_bytes()), &settings, |s| s.window_len)
            .unwrap();
        assert_eq!(len, 3);
        assert_eq!(store.session(id.as_bytes()).unwrap().window.len(), 3);
    }
    assert!(store.forget(b"sess-1"));
    assert!(store.session(b"sess-1").is_none());
}
