defmodule Observatory.Test.JSONSchemaTest do
  # The JSON-Schema subset the OpenAPI test checks real answers with: each keyword
  # accepts what conforms and reports what does not.
  use ExUnit.Case, async: true

  alias Observatory.Test.JSONSchema

  defp errors(schema, value, root \\ %{}), do: JSONSchema.errors(schema, value, root)

  test "type: a name or a list, null among them; integers are numbers, not the reverse" do
    assert errors(%{"type" => "integer"}, 3) == []
    assert errors(%{"type" => "number"}, 3) == []
    assert [_] = errors(%{"type" => "integer"}, 3.5)
    assert errors(%{"type" => ["string", "null"]}, nil) == []
    assert [_] = errors(%{"type" => ["string", "null"]}, 1)
    assert [_] = errors(%{"type" => "object"}, [])
    assert errors(%{"type" => "boolean"}, false) == []
  end

  test "required, properties, additionalProperties (only the keys properties does not name)" do
    schema = %{
      "type" => "object",
      "required" => ["a"],
      "properties" => %{"a" => %{"type" => "string"}},
      "additionalProperties" => %{"type" => "integer"}
    }

    assert errors(schema, %{"a" => "x", "b" => 1}) == []
    assert ["$: a is required"] = errors(schema, %{"b" => 1})
    assert ["$.a: expected string, got 1"] = errors(schema, %{"a" => 1})
    assert ["$.b: expected integer" <> _] = errors(schema, %{"a" => "x", "b" => "y"})
    assert [_] = errors(%{"additionalProperties" => false}, %{"z" => 1})
  end

  test "items, enum, const, bounds" do
    assert errors(%{"items" => %{"enum" => ["a", "b"]}}, ["a", "b"]) == []

    assert ["$[1]: \"c\" is not one of" <> _] =
             errors(%{"items" => %{"enum" => ["a", "b"]}}, ["a", "c"])

    assert errors(%{"const" => true}, true) == []
    assert [_] = errors(%{"const" => true}, 1)
    assert [_] = errors(%{"minimum" => 0, "maximum" => 1}, 2)
    assert [_] = errors(%{"exclusiveMinimum" => 0}, 0)
    assert [_] = errors(%{"maxItems" => 1}, [1, 2])
    assert [_] = errors(%{"minLength" => 2}, "a")
  end

  test "oneOf needs exactly one match; anyOf at least one; allOf every one" do
    one = %{"oneOf" => [%{"type" => "integer"}, %{"type" => "number"}]}
    assert errors(one, 1.5) == []
    assert ["$: matches 2 of oneOf" <> _] = errors(one, 1)
    assert ["$: matches none of oneOf" <> _] = errors(one, "x")
    assert errors(%{"anyOf" => [%{"type" => "integer"}, %{"type" => "number"}]}, 1) == []
    assert [_] = errors(%{"allOf" => [%{"type" => "number"}, %{"minimum" => 2}]}, 1)
  end

  test "$ref points into the root document; a dangling one and an unknown keyword are errors" do
    root = %{"components" => %{"schemas" => %{"N" => %{"type" => "integer"}}}}
    assert errors(%{"$ref" => "#/components/schemas/N"}, 1, root) == []
    assert [_] = errors(%{"$ref" => "#/components/schemas/N"}, "x", root)
    assert ["$: $ref" <> _] = errors(%{"$ref" => "#/components/schemas/Gone"}, 1, root)
    assert ["$: the validator does not know" <> _] = errors(%{"pattern" => "^a"}, "a")
    assert errors(%{"description" => "annotations are ignored", "example" => 1}, "a") == []
  end
end
