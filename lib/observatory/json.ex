defmodule Observatory.JSON do
  @moduledoc """
  JSON encoding and decoding, done in Rust with serde_json (Hex's Jason cannot be
  installed where Observatory is built, and OTP 25 has no JSON module).

  Decoding gives maps with string keys, lists, binaries, integers, floats, booleans
  and `nil`. Encoding accepts maps with string or atom keys, lists, strings, numbers,
  booleans, `nil` and atoms (written as strings). Inputs over 8 KiB run on a dirty
  scheduler so a big document never stalls a normal one.

      iex> Observatory.JSON.encode!(%{"score" => 0.2, "severity" => :loop})
      ~s({"score":0.2,"severity":"loop"})
      iex> Observatory.JSON.decode(~s({"a": [1, null]}))
      {:ok, %{"a" => [1, nil]}}
  """

  alias Observatory.Native

  @dirty_bytes Observatory.Native.Cost.dirty_bytes()

  @doc "Decodes a JSON document."
  @spec decode(binary()) :: {:ok, term()} | {:error, String.t()}
  def decode(text) when is_binary(text) and byte_size(text) > @dirty_bytes,
    do: Native.json_decode_dirty(text)

  def decode(text) when is_binary(text), do: Native.json_decode(text)

  @doc "Encodes a term as a JSON binary."
  @spec encode(term()) :: {:ok, binary()} | {:error, String.t()}
  def encode(term) do
    if dirty_encode?(term),
      do: Native.json_encode_dirty(term),
      else: Native.json_encode(term)
  end

  @doc false
  # Whether encoding `term` may take long enough to need a dirty scheduler: its
  # external size counts the bytes of its strings (a 1 MB string is 1 MB here, where
  # `:erts_debug.flat_size/1` counts it as a few words).
  def dirty_encode?(term), do: :erlang.external_size(term) > @dirty_bytes

  @doc "Like `encode/1`, raising `ArgumentError` on a term JSON cannot express."
  @spec encode!(term()) :: binary()
  def encode!(term) do
    case encode(term) do
      {:ok, json} -> json
      {:error, reason} -> raise ArgumentError, "cannot encode as JSON: #{reason}"
    end
  end

  @doc """
  Like `encode!/1`, but a string that is not valid UTF-8 is written with U+FFFD in
  place of its invalid bytes instead of failing: for answers and events that carry
  stored strings (an audit entry, an envelope), so one bad string written by an
  older release can never make them fail. Valid input costs nothing extra.

      iex> Observatory.JSON.encode_lossy!(%{"session_id" => <<"bad", 0xFF, "id">>})
      ~s({"session_id":"bad\uFFFDid"})
  """
  @spec encode_lossy!(term()) :: binary()
  def encode_lossy!(term) do
    case encode(term) do
      {:ok, json} -> json
      {:error, _} -> term |> scrub_utf8() |> encode!()
    end
  end

  @doc "Replaces the invalid bytes of every string in `term` (keys too) with U+FFFD."
  @spec scrub_utf8(term()) :: term()
  def scrub_utf8(term) when is_binary(term) do
    if String.valid?(term) do
      term
    else
      term
      |> String.chunk(:valid)
      |> Enum.map(fn chunk -> if String.valid?(chunk), do: chunk, else: "\uFFFD" end)
      |> IO.iodata_to_binary()
    end
  end

  def scrub_utf8(term) when is_list(term), do: Enum.map(term, &scrub_utf8/1)

  def scrub_utf8(%{__struct__: _} = struct), do: struct

  def scrub_utf8(term) when is_map(term),
    do: Map.new(term, fn {k, v} -> {scrub_utf8(k), scrub_utf8(v)} end)

  def scrub_utf8(term) when is_tuple(term),
    do: term |> Tuple.to_list() |> scrub_utf8() |> List.to_tuple()

  def scrub_utf8(term), do: term
end
