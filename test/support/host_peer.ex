defmodule Observatory.Test.HostPeer do
  @moduledoc false
  # A fresh VM (:peer) that loads none of Observatory's config files, as a host app's
  # VM does, with the test build's code; its logs come to the caller as
  # {:peer_log, text, mfa} (Observatory.Test.Remote.forward_logs/1).

  @doc "Names the test node (distribution), once: :peer needs it."
  def distribute! do
    unless Node.alive?() do
      {_, 0} = System.cmd("epmd", ["-daemon"])
      {:ok, _} = :net_kernel.start([:"observatory_test_#{System.pid()}@127.0.0.1", :longnames])
    end

    :ok
  end

  @doc "Starts one, linked to the caller; returns its node."
  def start do
    distribute!()

    {:ok, _peer, node} =
      :peer.start_link(%{
        name: :"host_#{System.unique_integer([:positive])}",
        host: ~c"127.0.0.1",
        longnames: true,
        args: Enum.flat_map(:code.get_path(), &[~c"-pa", &1])
      })

    :ok = :erpc.call(node, Observatory.Test.Remote, :forward_logs, [self()])
    node
  end

  @doc "The peers' log lines received so far (the mailbox is drained of them)."
  def logs do
    receive do
      {:peer_log, text, _} -> [text | logs()]
    after
      0 -> []
    end
  end
end
