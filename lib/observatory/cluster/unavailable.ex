defmodule Observatory.Cluster.Unavailable do
  @moduledoc """
  Raised by a durable write that the cluster cannot take now (reason `:healing`: it
  waited `:write_timeout_ms` while the replicas were being reconciled), or that would
  have committed after its caller's deadline (reason `:late`, see
  `Observatory.Storage.transaction/3`). Nothing was written. The HTTP API answers it
  `503 cluster_unavailable` with `Retry-After`; an owner call answers `:late` as
  `{:error, :late}` (`Observatory.Cluster.run_before/4`).
  """
  defexception [:message, reason: :healing]
end
