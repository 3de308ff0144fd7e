defmodule Observatory.Operator do
  @moduledoc false
  # Who an operator action's log line names. The dashboard and the HTTP API always pass
  # the signed-in operator; an Elixir call may leave `operator:` out, and its log line
  # should say so rather than "by nil".

  @spec describe(keyword()) :: String.t()
  def describe(opts) do
    case opts[:operator] do
      nil -> "an Elixir call without :operator"
      operator -> inspect(operator)
    end
  end
end
