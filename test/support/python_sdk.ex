defmodule Observatory.Test.PythonSDK do
  @moduledoc """
  Runs one of the `test/python/` scripts, which drive the real `openai` and
  `anthropic` SDKs, on the virtualenv's interpreter (`bin/setup`). The SDKs' own
  environment variables are cleared, so a developer's key or base URL never leaks
  in: a script gets the gateway's URL and keys only from its arguments. The script
  must exit 0; its last line of output is its JSON report, decoded.
  """

  import ExUnit.Assertions

  alias Observatory.JSON

  @python Path.expand("../python/.venv/bin/python", __DIR__)
  @cleared ~w(OPENAI_API_KEY OPENAI_BASE_URL ANTHROPIC_API_KEY ANTHROPIC_AUTH_TOKEN ANTHROPIC_BASE_URL)

  @doc "Runs `test/python/<script>` with `args` after the gateway's URL; its report."
  @spec run!(String.t(), [String.t()]) :: term()
  def run!(script, args) do
    path = Path.expand("../python/#{script}", __DIR__)
    env = for var <- @cleared, do: {var, nil}

    {out, status} =
      System.cmd(@python, [path, ObservatoryWeb.Endpoint.url() | args],
        env: env,
        stderr_to_stdout: true
      )

    assert status == 0, out
    {:ok, report} = out |> String.split("\n", trim: true) |> List.last() |> JSON.decode()
    report
  end
end
