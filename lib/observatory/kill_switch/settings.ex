defmodule Observatory.KillSwitch.Settings do
  @moduledoc """
  Validation of an agent's kill switch settings, as an operator sends them.

  | key | type | range |
  |---|---|---|
  | `enabled` | boolean | |
  | `window_size` | integer | `#{inspect(2..1000)}` — the last N requests the score looks at |
  | `threshold` | number | `> 0` — the agent is stopped when its score *exceeds* it |
  | `mode` | `"enforce"`, `"warn"` or `"shadow"` | what a score over the threshold does: stop the agent (`enforce`, the default); record it, alert and warn the model (`warn`); only record that it would have stopped the agent (`shadow`) |
  | `notification_webhook` | string or `nil` | an `http://` or `https://` URL, at most 2048 bytes, no `user:pass@`, no loopback/private host (`Observatory.KillSwitch.WebhookURL`) |

  Every key is optional (a partial update); an unknown key is refused, so a typo does
  not pass silently. Keys may be strings (JSON) or atoms.

      iex> Observatory.KillSwitch.Settings.validate(%{"enabled" => true, "threshold" => 5})
      {:ok, %{enabled: true, threshold: 5.0}}
      iex> Observatory.KillSwitch.Settings.validate(%{"window_size" => 1})
      {:error, [%{path: "window_size", reason: "must be an integer from 2 to 1000, got: 1"}]}

  The Rust core checks the same ranges again before a window is touched (a test pins
  the two together).
  """

  @window_sizes 2..1000
  @max_url_bytes 2048
  @keys %{
    "enabled" => :enabled,
    "window_size" => :window_size,
    "threshold" => :threshold,
    "mode" => :mode,
    "notification_webhook" => :notification_webhook
  }

  @type changes :: %{
          optional(:enabled) => boolean(),
          optional(:window_size) => pos_integer(),
          optional(:threshold) => float(),
          optional(:mode) => :enforce | :warn | :shadow,
          optional(:notification_webhook) => String.t() | nil
        }
  @type violation :: %{path: String.t(), reason: String.t()}

  @doc "The window sizes an operator may set."
  @spec window_sizes() :: Range.t()
  def window_sizes, do: @window_sizes

  @doc "The highest score a window of `size` can reach: every earlier entry counts once per signal."
  @spec max_score(pos_integer()) :: float()
  def max_score(size) when is_integer(size), do: (1.0 + 2.0 + 1.5) * max(size - 1, 0)

  @doc "Checks `params`; returns the changes with atom keys, or every violation."
  @spec validate(map()) :: {:ok, changes()} | {:error, [violation()]}
  def validate(params),
    do: Observatory.Settings.validate(params, @keys, "is not a setting", &check/2)

  defp check(:enabled, value) when is_boolean(value), do: {:ok, value}
  defp check(:enabled, value), do: {:error, "must be true or false, got: #{inspect(value)}"}

  defp check(:window_size, value) when is_integer(value) and value in @window_sizes,
    do: {:ok, value}

  defp check(:window_size, value),
    do:
      {:error,
       "must be an integer from #{@window_sizes.first} to #{@window_sizes.last}, got: #{inspect(value)}"}

  defp check(:threshold, value) when is_number(value) and value > 0, do: {:ok, value / 1}

  defp check(:threshold, value),
    do: {:error, "must be a number greater than 0, got: #{inspect(value)}"}

  defp check(:mode, mode) when mode in [:enforce, :warn, :shadow], do: {:ok, mode}
  defp check(:mode, "enforce"), do: {:ok, :enforce}
  defp check(:mode, "warn"), do: {:ok, :warn}
  defp check(:mode, "shadow"), do: {:ok, :shadow}

  defp check(:mode, value),
    do: {:error, "must be enforce, warn or shadow, got: #{inspect(value)}"}

  defp check(:notification_webhook, nil), do: {:ok, nil}

  defp check(:notification_webhook, url) when is_binary(url) do
    if byte_size(url) <= @max_url_bytes do
      Observatory.KillSwitch.WebhookURL.check(url)
    else
      {:error, "must be an http:// or https:// URL of at most #{@max_url_bytes} bytes, or null"}
    end
  end

  defp check(:notification_webhook, value),
    do: {:error, "must be a URL string or null, got: #{inspect(value)}"}
end
