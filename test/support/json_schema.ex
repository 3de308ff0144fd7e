defmodule Observatory.Test.JSONSchema do
  @moduledoc false
  # The part of JSON Schema (2020-12, as OpenAPI 3.1 uses it) that docs/openapi.json
  # uses, to check real answers against it: $ref (into the same document), type (a
  # name or a list, "null" among them), enum, const, required, properties,
  # additionalProperties, items, allOf, anyOf, oneOf, minimum, maximum,
  # exclusiveMinimum, minLength, maxLength, maxItems. Annotations (description,
  # format, example) are ignored. A keyword it does not know fails loudly, so a spec
  # cannot rely on a check this validator silently skips.

  @annotations ~w(description format example examples title deprecated)
  @known ~w($ref type enum const required properties additionalProperties items allOf anyOf
            oneOf minimum maximum exclusiveMinimum minLength maxLength maxItems) ++ @annotations

  @doc """
  The errors of `value` (decoded JSON: string keys) against `schema`, `[]` when it
  conforms; `root` is the document `$ref`s point into. Each error: `"path: reason"`.
  """
  @spec errors(map() | boolean(), term(), map()) :: [String.t()]
  def errors(schema, value, root), do: check(schema, value, root, "$")

  defp check(true, _value, _root, _path), do: []
  defp check(false, _value, _root, path), do: ["#{path}: no value is allowed here"]

  defp check(%{"$ref" => "#/" <> pointer}, value, root, path) do
    keys = pointer |> String.split("/") |> Enum.map(&unescape/1)

    case get_in(root, keys) do
      nil -> ["#{path}: $ref #/#{pointer} points at nothing"]
      target -> check(target, value, root, path)
    end
  end

  defp check(schema, value, root, path) when is_map(schema) do
    case Map.keys(schema) -- @known do
      [] -> Enum.flat_map(schema, fn {k, v} -> keyword(k, v, value, root, path, schema) end)
      unknown -> ["#{path}: the validator does not know #{inspect(unknown)}"]
    end
  end

  defp unescape(key), do: key |> String.replace("~1", "/") |> String.replace("~0", "~")

  # The keys that this schema's own `properties` does not name.
  defp keyword("additionalProperties", schema, value, root, path, parent) when is_map(value) do
    named = Map.get(parent, "properties", %{})

    for {key, v} <- value,
        not Map.has_key?(named, key),
        error <- check(schema, v, root, "#{path}.#{key}"),
        do: error
  end

  defp keyword(keyword, arg, value, root, path, _parent),
    do: rule(keyword, arg, value, root, path)

  defp rule("type", types, value, _root, path) do
    if Enum.any?(List.wrap(types), &type?(&1, value)),
      do: [],
      else: ["#{path}: expected #{Enum.join(List.wrap(types), " or ")}, got #{inspect(value)}"]
  end

  defp rule("enum", values, value, _root, path),
    do:
      if(value in values,
        do: [],
        else: ["#{path}: #{inspect(value)} is not one of #{inspect(values)}"]
      )

  defp rule("const", expected, value, _root, path),
    do:
      if(value === expected,
        do: [],
        else: ["#{path}: expected #{inspect(expected)}, got #{inspect(value)}"]
      )

  defp rule("required", keys, value, _root, path) when is_map(value),
    do: for(key <- keys, not Map.has_key?(value, key), do: "#{path}: #{key} is required")

  defp rule("properties", props, value, root, path) when is_map(value) do
    Enum.flat_map(props, fn {key, schema} ->
      if Map.has_key?(value, key), do: check(schema, value[key], root, "#{path}.#{key}"), else: []
    end)
  end

  defp rule("items", schema, value, root, path) when is_list(value) do
    value
    |> Enum.with_index()
    |> Enum.flat_map(fn {item, i} -> check(schema, item, root, "#{path}[#{i}]") end)
  end

  defp rule("allOf", schemas, value, root, path),
    do: Enum.flat_map(schemas, &check(&1, value, root, path))

  defp rule("anyOf", schemas, value, root, path) do
    if Enum.any?(schemas, &(check(&1, value, root, path) == [])),
      do: [],
      else: ["#{path}: matches none of anyOf"]
  end

  defp rule("oneOf", schemas, value, root, path) do
    case Enum.count(schemas, &(check(&1, value, root, path) == [])) do
      1 ->
        []

      0 ->
        [
          "#{path}: matches none of oneOf: " <>
            inspect(Enum.map(schemas, &check(&1, value, root, path)))
        ]

      n ->
        ["#{path}: matches #{n} of oneOf, not exactly one"]
    end
  end

  defp rule("minimum", min, value, _root, path) when is_number(value),
    do: if(value >= min, do: [], else: ["#{path}: #{value} is below #{min}"])

  defp rule("maximum", max, value, _root, path) when is_number(value),
    do: if(value <= max, do: [], else: ["#{path}: #{value} is above #{max}"])

  defp rule("exclusiveMinimum", min, value, _root, path) when is_number(value),
    do: if(value > min, do: [], else: ["#{path}: #{value} is not above #{min}"])

  defp rule("minLength", min, value, _root, path) when is_binary(value),
    do: if(String.length(value) >= min, do: [], else: ["#{path}: shorter than #{min}"])

  defp rule("maxLength", max, value, _root, path) when is_binary(value),
    do: if(String.length(value) <= max, do: [], else: ["#{path}: longer than #{max}"])

  defp rule("maxItems", max, value, _root, path) when is_list(value),
    do: if(length(value) <= max, do: [], else: ["#{path}: more than #{max} items"])

  # A keyword that does not apply to this kind of value (e.g. `required` on a string).
  defp rule(_keyword, _arg, _value, _root, _path), do: []

  defp type?("null", value), do: value == nil
  defp type?("boolean", value), do: is_boolean(value)
  defp type?("string", value), do: is_binary(value)
  defp type?("integer", value), do: is_integer(value)
  defp type?("number", value), do: is_number(value)
  defp type?("array", value), do: is_list(value)
  defp type?("object", value), do: is_map(value)
end
