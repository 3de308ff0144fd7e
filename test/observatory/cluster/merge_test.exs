defmodule Observatory.Cluster.MergeTest do
  # The rules that decide a record when replicas disagree after a partition or a
  # restart: pure functions, tested on the versions each replica holds.
  use ExUnit.Case, async: true

  alias Observatory.Cluster.Merge

  @a :a@h
  @b :b@h
  @t0 ~U[2026-02-22 10:00:00.000000Z]
  @t1 ~U[2026-02-22 10:01:00.000000Z]
  @t2 ~U[2026-02-22 10:02:00.000000Z]

  # Nothing buried, no agent gone, unless a test says so.
  defp ctx(buried \\ [], gone \\ []) do
    %{
      buried?: fn table, key, identity -> {table, key, identity} in buried end,
      agent_gone?: fn id -> id in gone end
    }
  end

  defp agent(attrs) do
    Map.merge(
      %{
        id: "ag",
        active: true,
        deactivated_by: nil,
        deactivated_at: nil,
        reactivated_from: nil,
        kill_switch: %{enabled: true, window_size: 10, threshold: 10.0},
        notification_webhook: nil,
        created_at: @t0,
        updated_at: @t0
      },
      Map.new(attrs)
    )
  end

  defp agents(a, b),
    do: [{@a, a && {:observatory_agents, "ag", a}}, {@b, b && {:observatory_agents, "ag", b}}]

  describe "safety state holds: a deactivation made on either side" do
    test "an agent deactivated on one side and untouched on the other is inactive everywhere" do
      deactivated =
        agent(active: false, deactivated_by: :manual, deactivated_at: @t1, updated_at: @t1)

      assert {:keep, {:observatory_agents, "ag", merged}, note} =
               Merge.decide(
                 :observatory_agents,
                 "ag",
                 agents(agent([]), deactivated),
                 [@a],
                 ctx()
               )

      assert %{active: false, deactivated_by: :manual, deactivated_at: @t1} = merged
      assert note =~ "kept inactive"
    end

    test "concurrent: activated on one side (undoing an older deactivation), deactivated again on the other — the safer state wins" do
      # Both sides had the agent deactivated at t0. Side a activated it (undoing t0);
      # side b's kill switch deactivated it again at t2 — not the deactivation a undid.
      activated = agent(active: true, reactivated_from: @t0, updated_at: @t1)

      tripped =
        agent(active: false, deactivated_by: :kill_switch, deactivated_at: @t2, updated_at: @t2)

      assert {:keep, {_, _, merged}, note} =
               Merge.decide(:observatory_agents, "ag", agents(activated, tripped), [@a], ctx())

      assert %{active: false, deactivated_by: :kill_switch, deactivated_at: @t2} = merged
      assert note =~ "the safer state"
    end

    test "not a conflict: an activation that undid the very deactivation the other side still holds keeps the agent active" do
      # Negative path of the rule above: the other side's copy is just stale.
      stale = agent(active: false, deactivated_by: :manual, deactivated_at: @t0, updated_at: @t0)
      activated = agent(active: true, reactivated_from: @t0, updated_at: @t1)

      assert {:keep, {_, _, merged}, _note} =
               Merge.decide(:observatory_agents, "ag", agents(stale, activated), [@a], ctx())

      assert merged.active
      assert merged.updated_at == @t1
    end

    test "settings come from the latest version; the earliest creation time is kept" do
      older =
        agent(kill_switch: %{enabled: false, window_size: 10, threshold: 10.0}, updated_at: @t0)

      newer =
        agent(
          kill_switch: %{enabled: true, window_size: 20, threshold: 5.0},
          updated_at: @t2,
          created_at: @t1
        )

      assert {:keep, {_, _, merged}, nil} =
               Merge.decide(:observatory_agents, "ag", agents(older, newer), [@a], ctx())

      assert merged.kill_switch.window_size == 20
      assert merged.created_at == @t0
    end
  end

  describe "deletions made on purpose hold (tombstones)" do
    test "an agent deleted on one side stays deleted when the other side still has that agent" do
      buried = [{:observatory_agents, "ag", @t0}]

      assert {:delete, note} =
               Merge.decide(:observatory_agents, "ag", agents(agent([]), nil), [@b], ctx(buried))

      assert note =~ "deleted"
    end

    test "an agent registered again after its deletion is not covered by the old tombstone" do
      buried = [{:observatory_agents, "ag", @t0}]
      again = agent(created_at: @t2, updated_at: @t2)

      assert {:keep, {_, _, merged}, _} =
               Merge.decide(:observatory_agents, "ag", agents(nil, again), [@a], ctx(buried))

      assert merged.created_at == @t2
    end

    test "a key revoked on one side stays revoked; an unrevoked key issued on one side is copied" do
      info = %{key_id: "k1", agent_id: "ag", created_at: @t0, seeded: false}
      record = {:observatory_agent_keys, "hash", "ag", info}
      versions = [{@a, record}, {@b, nil}]

      assert {:delete, note} =
               Merge.decide(
                 :observatory_agent_keys,
                 "hash",
                 versions,
                 [@b],
                 ctx([{:observatory_agent_keys, "hash", :revoked}])
               )

      assert note =~ "revoked"

      assert {:keep, ^record, note} =
               Merge.decide(:observatory_agent_keys, "hash", versions, [@b], ctx())

      assert note =~ "copied everywhere"
    end

    test "the keys and events of a deleted agent go with it" do
      info = %{key_id: "k1", agent_id: "ag", created_at: @t0, seeded: false}
      key = [{@a, {:observatory_agent_keys, "h", "ag", info}}, {@b, nil}]
      assert {:delete, _} = Merge.decide(:observatory_agent_keys, "h", key, [@a], ctx([], ["ag"]))

      event = [{@a, {:observatory_agent_events, {"ag", 1, 1}, %{}}}, {@b, nil}]

      assert {:delete, _} =
               Merge.decide(:observatory_agent_events, {"ag", 1, 1}, event, [@a], ctx([], ["ag"]))

      assert {:keep, _, _} =
               Merge.decide(:observatory_agent_events, {"ag", 1, 1}, event, [@a], ctx())
    end
  end

  describe "pauses and blocks made on either side hold" do
    test "a pause made on one side only is kept everywhere, and said so" do
      pause = {:observatory_hitl_pauses, "s1", %{operator: "alice", reason: "", at: @t1}}

      assert {:keep, ^pause, note} =
               Merge.decide(:observatory_hitl_pauses, "s1", [{@a, nil}, {@b, pause}], [@a], ctx())

      assert note =~ "paused on b@h, not on a@h"
    end

    test "a resume holds over the copy of the very pause it removed, not over a newer pause" do
      old = {:observatory_hitl_pauses, "s1", %{operator: "alice", reason: "", at: @t0}}
      new = {:observatory_hitl_pauses, "s1", %{operator: "bob", reason: "", at: @t2}}
      resumed = ctx([{:observatory_hitl_pauses, "s1", @t0}])

      assert {:delete, _} =
               Merge.decide(:observatory_hitl_pauses, "s1", [{@a, nil}, {@b, old}], [@a], resumed)

      assert {:keep, ^new, _} =
               Merge.decide(:observatory_hitl_pauses, "s1", [{@a, new}, {@b, old}], [@b], resumed)
    end

    test "a step-detector block made on one side holds; its reset holds too" do
      block = {:observatory_step_blocks, "s2", %{guidance: "stop", at: @t1}}
      versions = [{@a, block}, {@b, nil}]

      assert {:keep, ^block, _} =
               Merge.decide(:observatory_step_blocks, "s2", versions, [@b], ctx())

      reset = ctx([{:observatory_step_blocks, "s2", @t1}])
      assert {:delete, _} = Merge.decide(:observatory_step_blocks, "s2", versions, [@b], reset)
    end
  end

  describe "logs are unions" do
    test "audit entries written on each side are all kept (their keys never collide)" do
      entry = {:observatory_hitl_audit, {1, @b, 7}, %{action: :pause}}

      assert {:keep, ^entry, nil} =
               Merge.decide(
                 :observatory_hitl_audit,
                 {1, @b, 7},
                 [{@a, nil}, {@b, entry}],
                 [@a],
                 ctx()
               )
    end

    test "a signed-out dashboard session stays signed out, until the later expiry" do
      versions = [
        {@a, {:observatory_revoked_sessions, "sid", 100}},
        {@b, {:observatory_revoked_sessions, "sid", 200}}
      ]

      assert {:keep, {_, "sid", 200}, nil} =
               Merge.decide(:observatory_revoked_sessions, "sid", versions, [@a], ctx())
    end

    test "a table without a rule: union, the base's version where they differ" do
      versions = [{@a, {:observatory_other, 1, :from_a}}, {@b, {:observatory_other, 1, :from_b}}]

      assert {:keep, {_, 1, :from_b}, nil} =
               Merge.decide(:observatory_other, 1, versions, [@b], ctx())

      assert {:keep, {_, 1, :from_a}, nil} =
               Merge.decide(:observatory_other, 1, versions, [@a], ctx())
    end
  end

  test "tombstones and agents are reconciled before the tables whose rules read them" do
    assert Merge.order([
             :observatory_step_blocks,
             :observatory_agents,
             :observatory_tombstones,
             :observatory_agent_keys
           ]) ==
             [
               :observatory_tombstones,
               :observatory_agents,
               :observatory_agent_keys,
               :observatory_step_blocks
             ]
  end
end
