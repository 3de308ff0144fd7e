defmodule Observatory.DerivedSetting do
  @moduledoc false
  # What a setting comes to (thresholds packed for a NIF, limits, checked sinks …),
  # worked out again only when the setting differs from the one it was worked out
  # for. The caller reads the setting on every call, so `Application.put_env/3`
  # applies to the next one; a call whose setting is unchanged pays one
  # `:persistent_term` read and a comparison.

  @doc """
  `derive.(setting)`, kept under `key` in `:persistent_term` beside the `setting` it
  came from and returned again while the setting is the same.
  """
  @spec get(term(), term(), (term() -> value)) :: value when value: term()
  def get(key, setting, derive) do
    case :persistent_term.get(key, nil) do
      {^setting, value} ->
        value

      _changed ->
        value = derive.(setting)
        :persistent_term.put(key, {setting, value})
        value
    end
  end
end
