defmodule Observatory.Cluster.Unavailable do
  @moduledoc """
  Raised by a durable write that the cluster cannot take now (it waited
  `:write_timeout_ms` while the replicas were being reconciled). Nothing was
  written. The HTTP API answers it `503 cluster_unavailable` with `Retry-After`.
  """
  defexception [:message, reason: :healing]
end
