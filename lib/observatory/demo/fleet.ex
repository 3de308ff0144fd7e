defmodule Observatory.Demo.Fleet do
  @moduledoc """
  A simulated fleet for the demo mode (`config :observatory, demo: true`): every
  `:demo_interval_ms` each agent sends its next DecisionLog through the real ingest
  path (`SchemaInterceptor`), so WARNING and LOOP show up within seconds.

    * `agent-healthy-*` — varied, successful steps: stay Normal;
    * `agent-stuck` — the same tool, the same failure, again and again (LOOP);
    * `agent-pingpong` — two tools alternating, edit then failing build (WARNING);
    * `agent-recovers` — loops for a while, then finds its way (LOOP, then Normal).
  """

  use GenServer
  require Logger

  alias Observatory.Gateway.SchemaInterceptor

  @healthy [
    {"plan", "read_file", "success"},
    {"edit", "write_file", "success"},
    {"verify", "run_tests", "success"},
    {"search", "grep", "success"},
    {"summarize", "respond", "success"},
    {"fetch", "http_get", "success"}
  ]

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc "The demo agents: `{session_id, agent_id, step_fun}`."
  def agents do
    [
      {"sess-healthy-1", "agent-healthy-1", fn n -> Enum.at(@healthy, rem(n, 6)) end},
      {"sess-healthy-2", "agent-healthy-2", fn n -> Enum.at(@healthy, rem(n * 5 + 1, 6)) end},
      {"sess-stuck", "agent-stuck", fn _ -> {"search", "read_file", "failure"} end},
      {"sess-pingpong", "agent-pingpong",
       fn n ->
         if rem(n, 2) == 0,
           do: {"fix", "edit_file", "success"},
           else: {"check", "run_build", "failure"}
       end},
      {"sess-recovers", "agent-recovers",
       fn n ->
         if rem(n, 40) < 12, do: {"query", "sql", "timeout"}, else: Enum.at(@healthy, rem(n, 6))
       end}
    ]
  end

  @impl true
  def init(_opts) do
    send(self(), :step)
    Logger.info("demo fleet started: #{length(agents())} simulated agents")
    {:ok, %{n: 0, severities: %{}}}
  end

  @impl true
  def handle_info(:step, %{n: n} = state) do
    severities =
      for {session, agent, step} <- agents(), into: state.severities do
        {intent, tool, status} = step.(n)

        {:ok, result} =
          SchemaInterceptor.ingest(envelope(session, agent, n, intent, tool, status))

        if result.severity != Map.get(state.severities, session) and result.severity != :normal do
          Logger.info(
            "demo: #{session} is #{String.upcase(to_string(result.severity))} (entropy #{result.entropy_score})"
          )
        end

        {session, result.severity}
      end

    Process.send_after(self(), :step, Application.get_env(:observatory, :demo_interval_ms, 1_000))
    {:noreply, %{state | n: n + 1, severities: severities}}
  end

  def handle_info(_other, state), do: {:noreply, state}

  defp envelope(session, agent, n, intent, tool, status) do
    %{
      "meta" => %{
        "step_id" => "#{session}-#{n}",
        "session_id" => session,
        "agent_id" => agent,
        "parent_step_id" => if(n > 0, do: "#{session}-#{n - 1}"),
        "timestamp" => DateTime.utc_now() |> DateTime.to_iso8601()
      },
      "cognition" => %{"intent" => intent, "confidence" => 0.9, "entropy_score" => 0.9},
      "action" => %{
        "tool_call" => tool,
        "tool_input" => %{"step" => rem(n, 3)},
        "status" => status
      }
    }
  end
end
