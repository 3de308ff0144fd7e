defmodule Observatory.Bytes do
  @moduledoc false
  # Whether a binary holds another, for code on a request's or a step's path.
  #
  # On OTP 25, `:binary.match/2` (and `String.contains?/2`, which calls it) charges
  # a whole time slice, ~4,000 reductions, when it finds nothing in a subject shorter
  # than 8 bytes: the calling process is scheduled out right after, in the middle of
  # its work. A path segment such as `api` or `v1` cost every API request two
  # of them. Short subjects are compared here a position at a time instead.

  @doc "Whether `pattern` (not empty) occurs in `subject`, as `String.contains?/2`."
  @spec contains?(binary(), binary()) :: boolean()
  def contains?(subject, pattern) when byte_size(subject) >= 8 and byte_size(pattern) > 0,
    do: :binary.match(subject, pattern) != :nomatch

  def contains?(subject, pattern) when is_binary(subject) and byte_size(pattern) > 0,
    do: short_contains?(subject, pattern, 0, byte_size(subject) - byte_size(pattern))

  defp short_contains?(_subject, _pattern, at, last) when at > last, do: false

  defp short_contains?(subject, pattern, at, last),
    do:
      binary_part(subject, at, byte_size(pattern)) == pattern or
        short_contains?(subject, pattern, at + 1, last)
end
