defmodule Observatory.Bytes do
  @moduledoc false
  # Whether a binary holds another, and where it splits, for code on a request's or
  # a step's path.
  #
  # On OTP 25, `:binary.match/2`, `:binary.split/2` (and `String.contains?/2` and
  # `String.split/2`, which call them) charge a whole time slice, ~4,000 reductions,
  # when they find nothing in a subject shorter than 8 bytes: the calling process is
  # scheduled out right after, in the middle of its work. A path segment such as
  # `api` or `v1` cost every API request two of them, and a streamed answer's chunk
  # size line one a chunk. Short subjects are compared here a position at a time.

  @doc "Whether `pattern` (not empty) occurs in `subject`, as `String.contains?/2`."
  @spec contains?(binary(), binary()) :: boolean()
  def contains?(subject, pattern) when byte_size(subject) >= 8 and byte_size(pattern) > 0,
    do: :binary.match(subject, pattern) != :nomatch

  def contains?(subject, pattern) when is_binary(subject) and byte_size(pattern) > 0,
    do: short_find(subject, pattern, 0, byte_size(subject) - byte_size(pattern)) != nil

  @doc """
  `subject` split at the first `pattern` (not empty), as `:binary.split/2`:
  `[before, after]`, or `[subject]` when it does not occur.
  """
  @spec split(binary(), binary()) :: [binary()]
  def split(subject, pattern) when byte_size(subject) >= 8 and byte_size(pattern) > 0,
    do: :binary.split(subject, pattern)

  def split(subject, pattern) when is_binary(subject) and byte_size(pattern) > 0 do
    case short_find(subject, pattern, 0, byte_size(subject) - byte_size(pattern)) do
      nil ->
        [subject]

      at ->
        after_at = at + byte_size(pattern)

        [
          binary_part(subject, 0, at),
          binary_part(subject, after_at, byte_size(subject) - after_at)
        ]
    end
  end

  # Where `pattern` first occurs in `subject` at or after `at`, or nil.
  defp short_find(_subject, _pattern, at, last) when at > last, do: nil

  defp short_find(subject, pattern, at, last) do
    if binary_part(subject, at, byte_size(pattern)) == pattern,
      do: at,
      else: short_find(subject, pattern, at + 1, last)
  end
end
