defmodule Observatory.Settings do
  @moduledoc false
  # An operator's partial update of an agent's settings (the kill switch's, the
  # budget's), checked key by key: every violation is reported, not only the first,
  # and an unknown key is one (a typo must not pass silently).

  @type violation :: %{path: String.t(), reason: String.t()}
  @type check :: (atom(), term() -> {:ok, term()} | {:error, String.t()})

  @doc """
  Checks `params` (string or atom keys) against `fields` (`%{"name" => :field}`):
  `{:ok, changes}` with atom keys, each value as `check.(field, value)` returned it,
  or `{:error, violations}` sorted by path. An unknown key's reason is `unknown`
  followed by the names allowed.
  """
  @spec validate(term(), %{String.t() => atom()}, String.t(), check()) ::
          {:ok, map()} | {:error, [violation()]}
  def validate(params, fields, unknown, check) when is_map(params) do
    {changes, violations} =
      Enum.reduce(params, {%{}, []}, fn {key, value}, {changes, violations} ->
        name = to_string(key)

        case Map.fetch(fields, name) do
          {:ok, field} ->
            case check.(field, value) do
              {:ok, value} -> {Map.put(changes, field, value), violations}
              {:error, reason} -> {changes, [%{path: name, reason: reason} | violations]}
            end

          :error ->
            allowed = fields |> Map.keys() |> Enum.sort() |> Enum.join(", ")
            {changes, [%{path: name, reason: "#{unknown} (use #{allowed})"} | violations]}
        end
      end)

    case violations do
      [] -> {:ok, changes}
      _ -> {:error, Enum.sort_by(violations, & &1.path)}
    end
  end

  def validate(other, _fields, _unknown, _check),
    do: {:error, [%{path: "$", reason: "must be an object, got: #{inspect(other)}"}]}
end
