defmodule Observatory.Demo.Fleet do
  @moduledoc """
  A simulated fleet for the demo mode (`config :observatory, demo: true`): every
  `:demo_interval_ms` each agent sends its next DecisionLog — intent, tool, arguments,
  status and result, as a real coding or support agent would — through the real
  ingest path (`SchemaInterceptor`), so alerts, warnings and their evidence show up
  within seconds.

    * `agent-healthy-1`, `agent-healthy-2` — varied work that succeeds: never alerted;
    * `agent-stuck` — runs one identical failing `pytest` command again and again, the
      same failure each time: a loop to every signal;
    * `agent-pingpong` — edits a file, then the build fails the same way, round after
      round: the loop verdict calls the cycle a loop, the entropy ratio a warning;
    * `agent-recovers` — a query that times out five times (only its `elapsed_ms`
      changes), then it adds an index and gets on with its work: alerted, then clear.

  The demo agents are registered (`Observatory.KillSwitch.Agents.fetch_or_register/2`,
  the switch off), so their agent pages work. A paused session sends nothing until an operator
  resumes it. The step detector's `warn` and `block` directives are not obeyed (its
  blocks are durable: an obedient demo would never loop again after its first run),
  so a looping demo agent goes on until it is paused.
  """

  use GenServer
  require Logger

  alias Observatory.Gateway.{HITL, SchemaInterceptor}

  @pytest_failure %{
    "exit_code" => 1,
    "stdout" =>
      "============================= test session starts ==============================\n" <>
        "collected 4 items\n\n" <>
        "tests/test_auth.py ...F\n\n" <>
        "=================================== FAILURES ===================================\n" <>
        "________________________ test_login_returns_token ______________________________\n" <>
        "    def test_login_returns_token(client):\n" <>
        "        resp = client.post(\"/login\", json={\"user\": \"ada\", \"password\": \"pw\"})\n" <>
        ">       assert resp.status_code == 200\n" <>
        "E       assert 401 == 200\n\n" <>
        "tests/test_auth.py:31: AssertionError\n" <>
        "FAILED tests/test_auth.py::test_login_returns_token - assert 401 == 200\n" <>
        "========================= 1 failed, 3 passed in 0.42s =========================="
  }

  @build_failure "src/app.ts(3,20): error TS2307: Cannot find module './db/index' or its " <>
                   "corresponding type declarations.\n\nFound 1 error in src/app.ts:3"

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc """
  The demo agents: `{session_id, agent_id, step_fun}`; `step_fun.(n)` is the agent's
  `n`-th step (from 0) as `{intent, tool, input, status, result}`.
  """
  def agents do
    [
      {"sess-healthy-1", "agent-healthy-1", &coder/1},
      {"sess-healthy-2", "agent-healthy-2", &support/1},
      {"sess-stuck", "agent-stuck",
       fn _n ->
         {"Run the auth tests to check the fix", "bash",
          %{"command" => "pytest tests/test_auth.py -x"}, "failure", @pytest_failure}
       end},
      {"sess-pingpong", "agent-pingpong", &pingpong/1},
      {"sess-recovers", "agent-recovers", &recovers/1}
    ]
  end

  # Reads, searches, edits and tests a different module each round.
  defp coder(n) do
    module = "invoice_#{n}"

    case rem(n, 5) do
      0 ->
        {"Read the module", "read_file", %{"path" => "lib/billing/#{module}.ex"}, "success",
         "defmodule Billing.Invoice#{n} do\n  def total(lines), do: Enum.sum(lines)\nend"}

      1 ->
        {"Find its callers", "grep", %{"pattern" => "Invoice#{n - 1}.total", "path" => "lib"},
         "success", "lib/billing/report.ex:#{20 + n}:    Billing.Invoice#{n - 1}.total(lines)"}

      2 ->
        {"Add rounding", "edit_file",
         %{
           "path" => "lib/billing/invoice_#{n - 2}.ex",
           "old" => "Enum.sum(lines)",
           "new" => "lines |> Enum.sum() |> Float.round(2)"
         }, "success", "applied 1 edit to lib/billing/invoice_#{n - 2}.ex"}

      3 ->
        {"Run its tests", "bash",
         %{"command" => "mix test test/billing/invoice_#{n - 3}_test.exs"}, "success",
         %{"exit_code" => 0, "stdout" => "#{3 + rem(n, 4)} tests, 0 failures"}}

      4 ->
        {"Note the change", "respond", %{"text" => "Invoice #{n - 4}: totals are rounded now."},
         "success", "ok"}
    end
  end

  # Answers a different customer's question each round.
  defp support(n) do
    case rem(n, 3) do
      0 ->
        {"Look up the order", "http_get",
         %{"url" => "https://shop.example/api/orders/#{4100 + n}"}, "success",
         %{"status" => 200, "order" => %{"id" => 4100 + n, "state" => "shipped"}}}

      1 ->
        {"Search the help center", "search", %{"query" => "return window order #{4100 + n - 1}"},
         "success", "Returns are accepted within 30 days of delivery."}

      2 ->
        {"Answer the customer", "respond",
         %{"text" => "Order #{4100 + n - 2} has shipped; you can return it within 30 days."},
         "success", "sent"}
    end
  end

  # Edit, build, the same failure; edit, build, the same failure…
  defp pingpong(n) do
    if rem(n, 2) == 0,
      do:
        {"Fix the import", "edit_file",
         %{"path" => "src/app.ts", "old" => "from './db'", "new" => "from './db/index'"},
         "success", "applied 1 edit to src/app.ts"},
      else:
        {"Build the app", "bash", %{"command" => "npm run build"}, "failure",
         %{"exit_code" => 2, "stderr" => @build_failure}}
  end

  # Five timeouts of the same query, then an index and ordinary work.
  defp recovers(n) do
    query = "SELECT * FROM orders WHERE created_at > now() - interval '1 day'"

    case rem(n, 20) do
      i when i < 5 ->
        {"Count yesterday's orders", "sql", %{"query" => query}, "timeout",
         %{
           "error" => "canceling statement due to statement timeout",
           "elapsed_ms" => 5_000 + :erlang.phash2({n, i}, 40)
         }}

      5 ->
        {"Add an index", "sql",
         %{"query" => "CREATE INDEX CONCURRENTLY orders_created_at ON orders (created_at)"},
         "success", "CREATE INDEX"}

      i ->
        case rem(i, 4) do
          0 ->
            {"Count yesterday's orders", "sql", %{"query" => "#{query} AND region = #{i}"},
             "success", %{"rows" => 1, "count" => 800 + n}}

          1 ->
            {"Chart the counts", "python", %{"code" => "plot(counts, region=#{i - 1})"},
             "success", "saved charts/region_#{i - 1}.png"}

          2 ->
            {"Write the report", "write_file",
             %{"path" => "reports/region_#{i - 2}.md", "content" => "#{800 + n} orders"},
             "success", "wrote reports/region_#{i - 2}.md"}

          3 ->
            {"Send the summary", "respond", %{"text" => "Region #{i - 3}: #{800 + n} orders."},
             "success", "sent"}
        end
    end
  end

  @impl true
  def init(_opts) do
    for {_session, agent, _step} <- agents(), do: register(agent)
    send(self(), :step)
    Logger.info("demo fleet started: #{length(agents())} simulated agents")
    # Step ids are unique across restarts of the demo.
    {:ok, %{n: %{}, run: Base.encode16(:crypto.strong_rand_bytes(3), case: :lower)}}
  end

  @impl true
  def handle_info(:step, state) do
    n =
      for {session, agent, step} <- agents(), into: state.n do
        i = Map.get(state.n, session, 0)

        if HITL.paused?(session) do
          {session, i}
        else
          {:ok, _result} =
            SchemaInterceptor.ingest(envelope(session, agent, state.run, i, step.(i)),
              envelope: false
            )

          {session, i + 1}
        end
      end

    Process.send_after(self(), :step, Application.get_env(:observatory, :demo_interval_ms, 1_000))
    {:noreply, %{state | n: n}}
  end

  def handle_info(_other, state), do: {:noreply, state}

  # Registered as an operator would (the switch off, no settings event).
  defp register(agent) do
    case Observatory.KillSwitch.Agents.fetch_or_register(agent) do
      {:ok, _} -> :ok
      {:error, reason} -> Logger.warning("demo: could not register #{agent}: #{inspect(reason)}")
    end
  end

  defp envelope(session, agent, run, n, {intent, tool, input, status, result}) do
    %{
      "meta" => %{
        "step_id" => "#{session}-#{run}-#{n}",
        "session_id" => session,
        "agent_id" => agent,
        "parent_step_id" => if(n > 0, do: "#{session}-#{run}-#{n - 1}"),
        "timestamp" => DateTime.utc_now() |> DateTime.to_iso8601()
      },
      "cognition" => %{"intent" => intent, "confidence" => 0.9, "entropy_score" => 0.9},
      "action" => %{
        "tool_call" => tool,
        "tool_input" => input,
        "status" => status,
        "result" => result
      }
    }
  end
end
