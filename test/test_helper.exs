# Fail at once if the NIF did not load: every test below depends on it.
try do
  Observatory.Native.live_stores()
rescue
  error ->
    IO.puts(:stderr, "Observatory's NIF did not load: #{Exception.message(error)}")
    System.halt(1)
end

ExUnit.start(exclude: [:property, :browser])
