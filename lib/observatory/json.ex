defmodule Observatory.JSON do
  @moduledoc """
  JSON encoding and decoding, done in Rust with serde_json (Hex's Jason cannot be
  installed where Observatory is built, and OTP 25 has no JSON module).

  Decoding gives maps with string keys, lists, binaries, integers, floats, booleans
  and `nil`. Encoding accepts maps with string or atom keys, lists, strings, numbers,
  booleans, `nil` and atoms (written as strings). Inputs over 64 KiB run on a dirty
  scheduler so a big document never stalls a normal one.

      iex> Observatory.JSON.encode!(%{"score" => 0.2, "severity" => :loop})
      ~s({"score":0.2,"severity":"loop"})
      iex> Observatory.JSON.decode(~s({"a": [1, null]}))
      {:ok, %{"a" => [1, nil]}}
  """

  alias Observatory.Native

  @dirty_bytes 64 * 1024
  @dirty_words 16 * 1024

  @doc "Decodes a JSON document."
  @spec decode(binary()) :: {:ok, term()} | {:error, String.t()}
  def decode(text) when is_binary(text) and byte_size(text) > @dirty_bytes,
    do: Native.json_decode_dirty(text)

  def decode(text) when is_binary(text), do: Native.json_decode(text)

  @doc "Encodes a term as a JSON binary."
  @spec encode(term()) :: {:ok, binary()} | {:error, String.t()}
  def encode(term) do
    if :erts_debug.flat_size(term) > @dirty_words,
      do: Native.json_encode_dirty(term),
      else: Native.json_encode(term)
  end

  @doc "Like `encode/1`, raising `ArgumentError` on a term JSON cannot express."
  @spec encode!(term()) :: binary()
  def encode!(term) do
    case encode(term) do
      {:ok, json} -> json
      {:error, reason} -> raise ArgumentError, "cannot encode as JSON: #{reason}"
    end
  end
end
