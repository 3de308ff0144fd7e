defmodule Observatory.StorageOffError do
  @moduledoc """
  Raised by a call that needs Observatory's storage in a VM that runs with it off
  (`Observatory.Storage.mode/0`): a task beside a running server, or
  `config :observatory, storage: false`. The message says why and what to do.
  """

  defexception [:message]
end
