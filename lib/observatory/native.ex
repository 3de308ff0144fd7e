defmodule Observatory.Native do
  @moduledoc false
  # The Rust NIF (native/observatory_nif). Only Observatory's own modules call these;
  # every function here is replaced when the library loads.

  @on_load :load_nif

  def load_nif do
    path = :filename.join(:code.priv_dir(:observatory), ~c"native/observatory_nif")
    :erlang.load_nif(path, 0)
  end

  def entropy_store_new(_shards, _max_sessions), do: :erlang.nif_error(:nif_not_loaded)

  def entropy_record(
        _store,
        _session_id,
        _intent,
        _tool_call,
        _status,
        _agent_id,
        _window_size,
        _loop_threshold,
        _warning_threshold
      ),
      do: :erlang.nif_error(:nif_not_loaded)

  def entropy_tick(_store, _now_ms), do: :erlang.nif_error(:nif_not_loaded)
  def entropy_session(_store, _session_id), do: :erlang.nif_error(:nif_not_loaded)
  def entropy_list(_store, _limit), do: :erlang.nif_error(:nif_not_loaded)
  def entropy_forget(_store, _session_id), do: :erlang.nif_error(:nif_not_loaded)
  def entropy_sweep(_store, _now_ms, _ttl_ms), do: :erlang.nif_error(:nif_not_loaded)
  def entropy_stats(_store), do: :erlang.nif_error(:nif_not_loaded)
  def entropy_count(_store), do: :erlang.nif_error(:nif_not_loaded)

  def json_decode(_text), do: :erlang.nif_error(:nif_not_loaded)
  def json_decode_dirty(_text), do: :erlang.nif_error(:nif_not_loaded)
  def json_encode(_term), do: :erlang.nif_error(:nif_not_loaded)
  def json_encode_dirty(_term), do: :erlang.nif_error(:nif_not_loaded)

  def decision_log_parse(_body, _rules, _with_envelope), do: :erlang.nif_error(:nif_not_loaded)

  def decision_log_parse_dirty(_body, _rules, _with_envelope),
    do: :erlang.nif_error(:nif_not_loaded)

  def action_statuses, do: :erlang.nif_error(:nif_not_loaded)

  def json_stable_hash(_term), do: :erlang.nif_error(:nif_not_loaded)

  def replay_read_line(_line, _default_agent, _default_timestamp),
    do: :erlang.nif_error(:nif_not_loaded)

  def replay_read_line_dirty(_line, _default_agent, _default_timestamp),
    do: :erlang.nif_error(:nif_not_loaded)

  def answered_new, do: :erlang.nif_error(:nif_not_loaded)

  def answered_claim(_store, _step, _fingerprint, _limits, _now_ms),
    do: :erlang.nif_error(:nif_not_loaded)

  def answered_complete(_store, _slot, _seq, _answer), do: :erlang.nif_error(:nif_not_loaded)

  def answered_complete_encoded(_store, _slot, _seq, _answer),
    do: :erlang.nif_error(:nif_not_loaded)

  def answered_release(_store, _slot, _seq), do: :erlang.nif_error(:nif_not_loaded)

  def answered_sweep(_store, _now_ms, _window_ms), do: :erlang.nif_error(:nif_not_loaded)
  def answered_session_len(_store, _session_id), do: :erlang.nif_error(:nif_not_loaded)
  def answered_agent_len(_store, _agent_id), do: :erlang.nif_error(:nif_not_loaded)
  def answered_stats(_store), do: :erlang.nif_error(:nif_not_loaded)

  def session_log_new, do: :erlang.nif_error(:nif_not_loaded)

  def session_log_put_json(_store, _session_id, _json, _score, _number, _caps, _at_ms),
    do: :erlang.nif_error(:nif_not_loaded)

  def session_log_put_term(_store, _session_id, _etf, _bytes, _number, _caps),
    do: :erlang.nif_error(:nif_not_loaded)

  def session_log_steps(_store, _session_id, _ring), do: :erlang.nif_error(:nif_not_loaded)

  def session_log_step(_store, _session_id, _number, _ring),
    do: :erlang.nif_error(:nif_not_loaded)

  def session_log_head(_store, _session_id), do: :erlang.nif_error(:nif_not_loaded)
  def session_log_stats(_store), do: :erlang.nif_error(:nif_not_loaded)

  def session_log_trim(_store, _keep_sessions, _keep_bytes, _budget),
    do: :erlang.nif_error(:nif_not_loaded)

  def session_log_sweep(_store, _cutoff_ms, _budget), do: :erlang.nif_error(:nif_not_loaded)

  def step_store_new(_shards, _max_sessions), do: :erlang.nif_error(:nif_not_loaded)

  def step_settings_pack(_settings), do: :erlang.nif_error(:nif_not_loaded)

  def step_analyze(_store, _session_id, _approach, _outcome, _thresholds, _history),
    do: :erlang.nif_error(:nif_not_loaded)

  def step_state(_store, _session_id), do: :erlang.nif_error(:nif_not_loaded)
  def step_list(_store, _limit), do: :erlang.nif_error(:nif_not_loaded)
  def step_reset(_store, _session_id), do: :erlang.nif_error(:nif_not_loaded)
  def step_sweep(_store, _now_ms, _ttl_ms), do: :erlang.nif_error(:nif_not_loaded)

  def verdict_store_new(_shards, _max_sessions), do: :erlang.nif_error(:nif_not_loaded)

  def verdict_rules_new(_hex_ids, _epoch, _input_numbers, _result_numbers, _volatile),
    do: :erlang.nif_error(:nif_not_loaded)

  def verdict_config_check(_config), do: :erlang.nif_error(:nif_not_loaded)
  def verdict_config_pack(_config), do: :erlang.nif_error(:nif_not_loaded)
  def verdict_default_volatile_words, do: :erlang.nif_error(:nif_not_loaded)

  def verdict_observe(_store, _session_id, _keys, _entropy, _config),
    do: :erlang.nif_error(:nif_not_loaded)

  def verdict_state(_store, _session_id), do: :erlang.nif_error(:nif_not_loaded)
  def verdict_list(_store, _limit), do: :erlang.nif_error(:nif_not_loaded)
  def verdict_forget(_store, _session_id), do: :erlang.nif_error(:nif_not_loaded)
  def verdict_sweep(_store, _now_ms, _ttl_ms), do: :erlang.nif_error(:nif_not_loaded)

  # The entropy window, the loop verdict and the step detector of one step, in one call
  # (Observatory.Gateway.StepScore).
  def score_step(_stores, _session_id, _entropy, _keys, _verdict_config, _step, _step_settings),
    do: :erlang.nif_error(:nif_not_loaded)

  def breaker_new(_max_calls, _window_ms, _max_keys), do: :erlang.nif_error(:nif_not_loaded)

  def breaker_check(_breaker, _session_id, _tool, _args_hash, _now_ms),
    do: :erlang.nif_error(:nif_not_loaded)

  def breaker_prune(_breaker, _now_ms), do: :erlang.nif_error(:nif_not_loaded)

  def kill_switch_new(_shards, _max_agents), do: :erlang.nif_error(:nif_not_loaded)
  def kill_switch_tick(_store, _now_ms), do: :erlang.nif_error(:nif_not_loaded)
  def kill_switch_request_fingerprint(_body, _source), do: :erlang.nif_error(:nif_not_loaded)

  def kill_switch_request_fingerprint_dirty(_body, _source),
    do: :erlang.nif_error(:nif_not_loaded)

  def kill_switch_response_fingerprint(_body), do: :erlang.nif_error(:nif_not_loaded)
  def kill_switch_response_fingerprint_dirty(_body), do: :erlang.nif_error(:nif_not_loaded)

  def kill_switch_anthropic_request_fingerprint(_body, _source),
    do: :erlang.nif_error(:nif_not_loaded)

  def kill_switch_anthropic_request_fingerprint_dirty(_body, _source),
    do: :erlang.nif_error(:nif_not_loaded)

  def kill_switch_anthropic_response_fingerprint(_body), do: :erlang.nif_error(:nif_not_loaded)

  def kill_switch_anthropic_response_fingerprint_dirty(_body),
    do: :erlang.nif_error(:nif_not_loaded)

  def kill_switch_fingerprint(_text), do: :erlang.nif_error(:nif_not_loaded)
  def kill_switch_fingerprint_dirty(_text), do: :erlang.nif_error(:nif_not_loaded)
  def kill_switch_normalize(_text), do: :erlang.nif_error(:nif_not_loaded)
  def kill_switch_normalize_dirty(_text), do: :erlang.nif_error(:nif_not_loaded)

  def kill_switch_observe_request(_store, _agent_id, _prompt, _signatures, _size, _threshold),
    do: :erlang.nif_error(:nif_not_loaded)

  def kill_switch_observe_request_dirty(_store, _agent_id, _prompt, _sigs, _size, _threshold),
    do: :erlang.nif_error(:nif_not_loaded)

  def kill_switch_observe_response(_store, _agent_id, _hash),
    do: :erlang.nif_error(:nif_not_loaded)

  def kill_switch_resize(_store, _agent_id, _size), do: :erlang.nif_error(:nif_not_loaded)
  def kill_switch_clear(_store, _agent_id), do: :erlang.nif_error(:nif_not_loaded)
  def kill_switch_status(_store, _agent_id), do: :erlang.nif_error(:nif_not_loaded)
  def kill_switch_window(_store, _agent_id), do: :erlang.nif_error(:nif_not_loaded)
  def kill_switch_len(_store), do: :erlang.nif_error(:nif_not_loaded)

  # Observatory.Proxy.Responses
  def body_append_note(_body, _api, _note), do: :erlang.nif_error(:nif_not_loaded)
  def body_append_note_dirty(_body, _api, _note), do: :erlang.nif_error(:nif_not_loaded)
  def body_ensure_stream_usage(_body), do: :erlang.nif_error(:nif_not_loaded)
  def body_ensure_stream_usage_dirty(_body), do: :erlang.nif_error(:nif_not_loaded)
  def body_top_level_fields(_body, _names), do: :erlang.nif_error(:nif_not_loaded)
  def body_top_level_fields_dirty(_body, _names), do: :erlang.nif_error(:nif_not_loaded)

  def responses_request_fingerprint(_body, _source), do: :erlang.nif_error(:nif_not_loaded)

  def responses_request_fingerprint_dirty(_body, _source),
    do: :erlang.nif_error(:nif_not_loaded)

  def responses_response_fingerprint(_body), do: :erlang.nif_error(:nif_not_loaded)
  def responses_response_fingerprint_dirty(_body), do: :erlang.nif_error(:nif_not_loaded)

  def data_dir_lock(_path), do: :erlang.nif_error(:nif_not_loaded)
  def data_dir_unlock(_lock), do: :erlang.nif_error(:nif_not_loaded)
  def umask_owner_only, do: :erlang.nif_error(:nif_not_loaded)

  def live_stores, do: :erlang.nif_error(:nif_not_loaded)
  def store_hold(_store, _ms), do: :erlang.nif_error(:nif_not_loaded)
  def stores_held, do: :erlang.nif_error(:nif_not_loaded)
  def native_resource?(_term), do: :erlang.nif_error(:nif_not_loaded)
  def panic_probe, do: :erlang.nif_error(:nif_not_loaded)
  def dirty_cpu_hold(_ms), do: :erlang.nif_error(:nif_not_loaded)

  # Only in a library built with the cargo feature `alloc_count` (bench/nif_allocs.exs).
  def alloc_counts, do: :erlang.nif_error(:nif_not_loaded)
end
