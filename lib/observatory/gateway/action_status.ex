defmodule Observatory.Gateway.ActionStatus do
  @moduledoc """
  The fixed set of `action.status` values.

  Client strings are matched against this list and never turned into atoms
  (`String.to_atom/1` on input would let clients exhaust the atom table).
  """

  @statuses [:success, :failure, :error, :pending, :skipped, :timeout, :cancelled]

  @type t :: :success | :failure | :error | :pending | :skipped | :timeout | :cancelled

  @doc "Every status, in a stable order."
  @spec all() :: [t()]
  def all, do: @statuses

  @doc """
  Parses a client string.

      iex> Observatory.Gateway.ActionStatus.parse("failure")
      {:ok, :failure}
      iex> Observatory.Gateway.ActionStatus.parse("exploded")
      {:error, :invalid_status}
  """
  @spec parse(term()) :: {:ok, t()} | {:error, :invalid_status}
  for status <- @statuses do
    def parse(unquote(Atom.to_string(status))), do: {:ok, unquote(status)}
  end

  def parse(_), do: {:error, :invalid_status}

  @doc false
  # The small integer the Rust store keeps instead of the atom.
  @spec to_code(term()) :: {:ok, non_neg_integer()} | {:error, :invalid_status}
  for {status, code} <- Enum.with_index(@statuses) do
    def to_code(unquote(status)), do: {:ok, unquote(code)}
  end

  def to_code(_), do: {:error, :invalid_status}

  @doc false
  @spec from_code(non_neg_integer()) :: t()
  for {status, code} <- Enum.with_index(@statuses) do
    def from_code(unquote(code)), do: unquote(status)
  end
end
