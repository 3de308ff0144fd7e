//! NIFs behind `Observatory.Gateway.LoopVerdict`: the per-session verdict store and the
//! normalization rules the DecisionLog parse hashes with.

use observatory_core::keyed_store::KeyedStore;
use observatory_core::loop_verdict::keys::Normalization;
use observatory_core::loop_verdict::{
    Config, EntropySignal, Level, Reason, Rule, StepKeys, Verdict, VerdictState,
};
use observatory_core::normalize::{IdRules, VolatileWords, DEFAULT_VOLATILE_WORDS};
use observatory_core::severity::Severity;
use rustler::{Atom, Binary, Encoder, Env, NifResult, ResourceArc, Term};

use crate::atoms;
use crate::error::to_nif;

/// One `VerdictState` per session.
pub struct VerdictStore(pub(crate) KeyedStore<VerdictState>);

#[rustler::resource_impl]
impl rustler::Resource for VerdictStore {}

/// How tool inputs and results are normalized before hashing; read by the parse.
pub struct VerdictRules(pub Normalization);

#[rustler::resource_impl]
impl rustler::Resource for VerdictRules {}

/// `{history, max_period, {repeat_suspect, repeat_loop, blank_repeat_loop},
/// {cycle_suspect, cycle_loop}, {failure_suspect, failure_loop (0: never)}, entropy_rule,
/// {{near_share, near_repeat_suspect, near_repeat_loop, blank_near_repeat_loop},
/// {failure_run_suspect, failure_run_loop (0: never)},
/// {revisit_window, revisit_suspect, revisit_loop (0: never)}}}`.
pub(crate) type ConfigTuple = (
    usize,
    usize,
    (u32, u32, u32),
    (u32, u32),
    (u32, u32),
    bool,
    ((u32, u32, u32, u32), (u32, u32), (usize, u32, u32)),
);

/// The keys of a step as the DecisionLog parse returns them: one binary
/// ([`StepKeys::to_bytes`]), opaque to Elixir.
pub fn keys_term<'a>(env: Env<'a>, keys: &StepKeys) -> Term<'a> {
    crate::json::binary(env, &keys.to_bytes())
}

/// The keys from the parse's binary; `badarg` for anything else.
pub(crate) fn keys_from_term(keys: Binary<'_>) -> NifResult<StepKeys> {
    StepKeys::from_bytes(keys.as_slice()).ok_or(rustler::Error::BadArg)
}

#[rustler::nif]
fn verdict_store_new(env: Env<'_>, shards: usize, max_sessions: usize) -> Term<'_> {
    ResourceArc::new(VerdictStore(KeyedStore::new(shards, max_sessions))).encode(env)
}

/// Normalization rules: `hex_ids`, `epoch_timestamps`, whether plain numbers are
/// replaced in inputs and in results, and the volatile words.
#[rustler::nif]
fn verdict_rules_new(
    env: Env<'_>,
    hex_ids: bool,
    epoch_timestamps: bool,
    input_numbers: bool,
    result_numbers: bool,
    volatile: Vec<String>,
) -> Term<'_> {
    let words = VolatileWords::new(&volatile);
    let rules = |numbers| IdRules {
        hex_ids,
        epoch_timestamps,
        numbers,
        volatile: words.clone(),
    };
    let normalization = Normalization {
        input: rules(input_numbers),
        result: rules(result_numbers),
    };
    ResourceArc::new(VerdictRules(normalization)).encode(env)
}

/// The default volatile words (`observatory_core::normalize::DEFAULT_VOLATILE_WORDS`).
#[rustler::nif]
fn verdict_default_volatile_words() -> Vec<&'static str> {
    DEFAULT_VOLATILE_WORDS.to_vec()
}

/// `:ok` when the thresholds are valid, `{:error, :invalid_verdict_config}` otherwise.
#[rustler::nif]
fn verdict_config_check(config: ConfigTuple) -> NifResult<Atom> {
    to_config(config).map(|_| atoms::ok())
}

/// Records one step: `keys` as the parse returned them, `entropy` the tracker's
/// `{severity, window_len}` or nil. Returns
/// `{level, previous | nil, rule, reason, evidence, step}`.
#[rustler::nif]
fn verdict_observe<'a>(
    env: Env<'a>,
    store: ResourceArc<VerdictStore>,
    session_id: &str,
    keys: Binary<'a>,
    entropy: Option<(Atom, usize)>,
    config: ConfigTuple,
) -> NifResult<Term<'a>> {
    let config = to_config(config)?;
    let keys = keys_from_term(keys)?;
    let signal = entropy.and_then(|(severity, window)| {
        severity_of(severity).map(|severity| EntropySignal { severity, window })
    });
    Ok(observe(env, &store, session_id, keys, signal, &config))
}

/// Records one step in the session's state and encodes what `verdict_observe` returns.
pub(crate) fn observe<'a>(
    env: Env<'a>,
    store: &VerdictStore,
    session_id: &str,
    keys: StepKeys,
    signal: Option<EntropySignal>,
    config: &Config,
) -> Term<'a> {
    let verdict = store.0.update(session_id, VerdictState::new, |state| {
        state.observe(keys, signal, config)
    });
    observed_term(env, &verdict)
}

/// What `verdict_observe` returns for a step's verdict.
pub(crate) fn observed_term<'a>(env: Env<'a>, verdict: &Verdict) -> Term<'a> {
    (
        level_atom(verdict.level),
        verdict.previous.map(level_atom),
        rule_atom(verdict.rule),
        reason_term(env, &verdict.reason),
        verdict.evidence.as_slice(),
        verdict.step,
    )
        .encode(env)
}

/// The reason's sentence as a binary: a step that repeats nothing has it kept
/// ([`Reason::kept_sentence`]); a finding's is written on the stack (a `String` grown
/// as the sentence is written cost allocations each time).
fn reason_term<'a>(env: Env<'a>, reason: &Reason) -> Term<'a> {
    use std::fmt::Write;
    if let Some(sentence) = reason.kept_sentence() {
        return crate::json::binary(env, sentence.as_bytes());
    }
    let mut buf = StackText::default();
    if write!(buf, "{reason}").is_ok() {
        crate::json::binary(env, buf.as_bytes())
    } else {
        // Longer than the buffer (no sentence is): the heap.
        reason.to_string().encode(env)
    }
}

/// Text written into a fixed buffer; a write past its end fails.
struct StackText {
    bytes: [u8; 320],
    len: usize,
}

impl Default for StackText {
    fn default() -> Self {
        Self {
            bytes: [0; 320],
            len: 0,
        }
    }
}

impl StackText {
    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl std::fmt::Write for StackText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        let room = self.bytes.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        room.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// The session's latest verdict, `{level, rule, reason, evidence, step}`, or nil.
#[rustler::nif]
fn verdict_state<'a>(env: Env<'a>, store: ResourceArc<VerdictStore>, session_id: &str) -> Term<'a> {
    match store
        .0
        .read(session_id, |state| state.last().copied())
        .flatten()
    {
        Some(v) => verdict_term(env, &v),
        None => rustler::types::atom::nil().encode(env),
    }
}

/// Sessions whose latest verdict is not progress: `[{session_id, level, rule, reason,
/// evidence, step}]`, at most `limit`.
#[rustler::nif(schedule = "DirtyCpu")]
fn verdict_list<'a>(env: Env<'a>, store: ResourceArc<VerdictStore>, limit: usize) -> Term<'a> {
    let flagged = store.0.collect(limit, |state| {
        state.last().filter(|v| v.level != Level::Progress).copied()
    });
    flagged
        .iter()
        .map(|(id, v)| {
            (
                id.as_str(),
                level_atom(v.level),
                rule_atom(v.rule),
                v.reason.to_string(),
                v.evidence.as_slice(),
                v.step,
            )
        })
        .collect::<Vec<_>>()
        .encode(env)
}

#[rustler::nif]
fn verdict_forget(store: ResourceArc<VerdictStore>, session_id: &str) -> bool {
    store.0.remove(session_id)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn verdict_sweep(store: ResourceArc<VerdictStore>, now_ms: i64, ttl_ms: u64) -> usize {
    store.0.sweep(now_ms, ttl_ms)
}

pub(crate) fn to_config(t: ConfigTuple) -> NifResult<Config> {
    let (history, max_period, repeat, cycle, failure, entropy, (near, failure_run, revisit)) = t;
    // 0: never (`:never` in Elixir).
    let never_as_zero = |n: u32| (n > 0).then_some(n);
    let config = Config {
        history,
        max_period,
        repeat_suspect: repeat.0,
        repeat_loop: repeat.1,
        blank_repeat_loop: repeat.2,
        cycle_suspect: cycle.0,
        cycle_loop: cycle.1,
        failure_suspect: failure.0,
        failure_loop: never_as_zero(failure.1),
        entropy,
        near_share: near.0,
        near_repeat_suspect: near.1,
        near_repeat_loop: near.2,
        blank_near_repeat_loop: near.3,
        failure_run_suspect: failure_run.0,
        failure_run_loop: never_as_zero(failure_run.1),
        revisit_window: revisit.0,
        revisit_suspect: revisit.1,
        revisit_loop: never_as_zero(revisit.2),
    };
    config.validate().map_err(to_nif)?;
    Ok(config)
}

/// The thresholds `verdict_observe` takes (a [`ConfigTuple`]), checked and packed as
/// `score_step` takes them ([`Config::pack`]): a binary is read in one call where the
/// nested tuple took some thirty (the caller packs once per change of the
/// configuration, not per step).
#[rustler::nif]
fn verdict_config_pack(env: Env<'_>, config: ConfigTuple) -> NifResult<Term<'_>> {
    let config = to_config(config)?;
    Ok(crate::json::binary(env, &config.pack()))
}

fn verdict_term<'a>(env: Env<'a>, v: &Verdict) -> Term<'a> {
    (
        level_atom(v.level),
        rule_atom(v.rule),
        v.reason.to_string(),
        v.evidence.as_slice(),
        v.step,
    )
        .encode(env)
}

fn severity_of(atom: Atom) -> Option<Severity> {
    if atom == atoms::loop_() {
        Some(Severity::Loop)
    } else if atom == atoms::warning() {
        Some(Severity::Warning)
    } else if atom == atoms::normal() {
        Some(Severity::Normal)
    } else {
        None
    }
}

fn level_atom(level: Level) -> Atom {
    match level {
        Level::Progress => atoms::progress(),
        Level::Suspect => atoms::suspect(),
        Level::Loop => atoms::loop_(),
    }
}

fn rule_atom(rule: Rule) -> Atom {
    match rule {
        Rule::None => atoms::none(),
        Rule::Repeat => atoms::repeat(),
        Rule::Cycle => atoms::cycle(),
        Rule::NearRepeat => atoms::near_repeat(),
        Rule::FailureRun => atoms::failure_run(),
        Rule::Revisit => atoms::revisit(),
        Rule::SameFailure => atoms::same_failure(),
        Rule::Entropy => atoms::entropy(),
    }
}
