defmodule Observatory.BytesTest do
  use ExUnit.Case, async: true

  alias Observatory.Bytes

  # Every subject of up to 9 bytes over a small alphabet, against every pattern of up
  # to 3 bytes over it: the answers String.contains?/2 gives, on both sides of the
  # 8-byte line where the short comparison takes over from :binary.match/2.
  test "contains?/2 answers as String.contains?/2 for every short subject and pattern" do
    alphabet = ["a", "%", "\n"]
    subjects = words(alphabet, 0..9)
    patterns = words(alphabet, 1..3)

    for subject <- subjects, pattern <- patterns do
      assert Bytes.contains?(subject, pattern) == String.contains?(subject, pattern),
             "#{inspect(subject)} #{inspect(pattern)}"
    end
  end

  test "split/2 splits as :binary.split/2 for every short subject and pattern" do
    subjects = words(["a", ";", "\r\n"], 0..6)
    patterns = ["a", ";", "\r\n", "a;", ";;a"]

    for subject <- subjects, pattern <- patterns do
      assert Bytes.split(subject, pattern) == :binary.split(subject, pattern),
             "#{inspect(subject)} #{inspect(pattern)}"
    end
  end

  test "an empty pattern is refused, as :binary.match/2 refuses it" do
    assert_raise FunctionClauseError, fn -> Bytes.contains?("api", "") end
    assert_raise FunctionClauseError, fn -> Bytes.contains?("decision_logs", "") end
    assert_raise FunctionClauseError, fn -> Bytes.split("1a", "") end
  end

  # What the module is for: looking through a few bytes and finding nothing does not
  # use up the caller's time slice (~4,000 reductions: the process would be
  # scheduled out in the middle of its request).
  test "finding nothing in a short subject costs a few reductions, not a time slice" do
    for subject <- ["", "a", "v1", "api", "agents", "1.2.3.4"] do
      assert reductions(fn -> Bytes.contains?(subject, "%") end) < 200, inspect(subject)
      assert reductions(fn -> Bytes.split(subject, ";") end) < 200, inspect(subject)
    end
  end

  # A request's path is decoded a segment at a time; `/api/v1/…` has two short ones.
  test "a request for an API path is read without using up a time slice" do
    defmodule Adapter do
      def request(_req) do
        %{
          method: "POST",
          path_segments: ["api", "v1", "decision_logs"],
          query_string: "",
          headers: [{"content-type", "application/json"}, {"content-length", "2"}],
          remote_ip: "127.0.0.1"
        }
      end
    end

    conn = ObservatoryWeb.Conn.new(Adapter, nil)
    assert conn.path_info == ["api", "v1", "decision_logs"]
    assert conn.bad_request == nil
    assert reductions(fn -> ObservatoryWeb.Conn.new(Adapter, nil) end) < 1_500
  end

  # Every word of `lengths` letters (each letter a binary) over `alphabet`.
  defp words(alphabet, lengths) do
    Enum.flat_map(lengths, fn n ->
      Enum.reduce(1..n//1, [""], fn _, acc -> for w <- acc, c <- alphabet, do: w <> c end)
    end)
  end

  defp reductions(fun) do
    {:reductions, before} = Process.info(self(), :reductions)
    fun.()
    {:reductions, now} = Process.info(self(), :reductions)
    now - before
  end
end
