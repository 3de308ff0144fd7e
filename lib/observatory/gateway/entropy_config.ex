defmodule Observatory.Gateway.EntropyConfig do
  @moduledoc """
  Reads the entropy settings from the application environment on every call
  (FR-9.11), so `Application.put_env/3` takes effect on the next message.

  | key | default | valid |
  |---|---|---|
  | `:entropy_window_size` | `5` | integer 1..1024 |
  | `:entropy_loop_threshold` | `0.25` | number 0..1 |
  | `:entropy_warning_threshold` | `0.50` | number 0..1 |

  An invalid value never crashes the caller: it is replaced by the default and a
  warning is logged once per distinct invalid value (not once per message).
  """

  require Logger

  @app :observatory
  @max_window 1024

  @doc "`{window_size, loop_threshold, warning_threshold}`, validated."
  @spec read() :: {pos_integer(), float(), float()}
  def read do
    {window_size(), threshold(:entropy_loop_threshold, 0.25),
     threshold(:entropy_warning_threshold, 0.50)}
  end

  @doc "The largest window size accepted."
  def max_window_size, do: @max_window

  @doc "`:entropy_window_size`, validated (the loop verdict reads it for its entropy rule)."
  @spec window_size() :: pos_integer()
  def window_size do
    case Application.get_env(@app, :entropy_window_size, 5) do
      n when is_integer(n) and n >= 1 and n <= @max_window -> valid(:entropy_window_size, n)
      other -> invalid(:entropy_window_size, other, 5)
    end
  end

  defp threshold(key, default) do
    case Application.get_env(@app, key, default) do
      t when is_number(t) and t >= 0 and t <= 1 -> valid(key, t / 1)
      other -> invalid(key, other, default)
    end
  end

  # The invalid values already warned about, per key, live in one :persistent_term
  # map, so a warning is logged once per change. A valid read only looks the map up;
  # it is written when a value turns invalid or valid again, which is rare.
  defp valid(key, value) do
    warned = :persistent_term.get(__MODULE__, %{})

    if is_map_key(warned, key) do
      :persistent_term.put(__MODULE__, Map.delete(warned, key))
    end

    value
  end

  defp invalid(key, value, default) do
    warned = :persistent_term.get(__MODULE__, %{})

    if Map.get(warned, key, :none) != {:invalid, value} do
      :persistent_term.put(__MODULE__, Map.put(warned, key, {:invalid, value}))

      Logger.warning(
        "invalid #{inspect(@app)} #{inspect(key)}: #{inspect(value)}; using the default #{inspect(default)}"
      )
    end

    default
  end
end
