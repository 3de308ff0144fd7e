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
    validate(
      Application.get_env(@app, :entropy_window_size, 5),
      Application.get_env(@app, :entropy_loop_threshold, 0.25),
      Application.get_env(@app, :entropy_warning_threshold, 0.50)
    )
  end

  @doc false
  # `read/0` of the three values as the caller read them (`StepScore` reads them with
  # the step's other settings): each invalid one replaced by its default, warned about
  # once per value.
  @spec validate(term(), term(), term()) :: {pos_integer(), float(), float()}
  def validate(size, loop, warning) do
    if valid_size?(size) and valid_threshold?(loop) and valid_threshold?(warning) and
         :persistent_term.get(__MODULE__, nil) == nil do
      # The hot path: three reads, three guards, one lookup.
      {size, loop / 1, warning / 1}
    else
      {check(:entropy_window_size, size, 5, &valid_size?/1),
       check(:entropy_loop_threshold, loop, 0.25, &valid_threshold?/1) / 1,
       check(:entropy_warning_threshold, warning, 0.50, &valid_threshold?/1) / 1}
    end
  end

  @doc "The largest window size accepted."
  def max_window_size, do: @max_window

  @doc "Whether `n` is a valid `:entropy_window_size`: an integer 1..`max_window_size/0`."
  @spec valid_size?(term()) :: boolean()
  def valid_size?(n), do: is_integer(n) and n >= 1 and n <= @max_window

  @doc "Whether `t` is a valid entropy threshold: a number 0..1."
  @spec valid_threshold?(term()) :: boolean()
  def valid_threshold?(t), do: is_number(t) and t >= 0 and t <= 1

  @doc "`:entropy_window_size`, validated (the loop verdict reads it for its entropy rule)."
  @spec window_size() :: pos_integer()
  def window_size do
    check(
      :entropy_window_size,
      Application.get_env(@app, :entropy_window_size, 5),
      5,
      &valid_size?/1
    )
  end

  # The invalid values already warned about, per key, live in one :persistent_term
  # map (absent while every value is valid), so a warning is logged once per change.
  # It is written only when a value turns invalid or valid again, which is rare.
  defp check(key, value, default, valid?) do
    warned = :persistent_term.get(__MODULE__, %{})

    cond do
      valid?.(value) ->
        if is_map_key(warned, key), do: forget_warning(warned, key)
        value

      Map.get(warned, key) == {:invalid, value} ->
        default

      true ->
        :persistent_term.put(__MODULE__, Map.put(warned, key, {:invalid, value}))

        Logger.warning(
          "invalid #{inspect(@app)} #{inspect(key)}: #{inspect(value)}; using the default #{inspect(default)}"
        )

        default
    end
  end

  defp forget_warning(warned, key) do
    case Map.delete(warned, key) do
      empty when map_size(empty) == 0 -> :persistent_term.erase(__MODULE__)
      rest -> :persistent_term.put(__MODULE__, rest)
    end
  end
end
