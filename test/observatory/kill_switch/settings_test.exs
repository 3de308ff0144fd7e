defmodule Observatory.KillSwitch.SettingsTest do
  use ExUnit.Case, async: true

  alias Observatory.KillSwitch.Settings

  doctest Settings

  test "keys may be strings or atoms; integers become float thresholds; webhooks may be cleared" do
    assert Settings.validate(%{enabled: false, window_size: 2, threshold: 1}) ==
             {:ok, %{enabled: false, window_size: 2, threshold: 1.0}}

    assert Settings.validate(%{"window_size" => 1000, "notification_webhook" => nil}) ==
             {:ok, %{window_size: 1000, notification_webhook: nil}}

    assert Settings.validate(%{}) == {:ok, %{}}
  end

  test "every violation is reported, sorted by path" do
    assert {:error, violations} =
             Settings.validate(%{"threshold" => "high", "window_size" => 0, "colour" => "red"})

    assert Enum.map(violations, & &1.path) == ["colour", "threshold", "window_size"]
    assert {:error, [%{path: "$"}]} = Settings.validate([1])
  end

  test "webhooks must be http(s) URLs with a host, at most 2048 bytes" do
    for url <- ["http://localhost:9000/hook", "https://hooks.example.com/a?b=c"] do
      assert {:ok, _} = Settings.validate(%{notification_webhook: url})
    end

    long = "https://example.com/" <> String.duplicate("a", 2048)

    for url <- ["hooks.example.com", "ftp://example.com", "https://", "", long, 7] do
      assert {:error, [%{path: "notification_webhook"}]} =
               Settings.validate(%{notification_webhook: url})
    end
  end

  test "max_score is 4.5 per earlier entry" do
    assert Settings.max_score(2) == 4.5
    assert Settings.max_score(10) == 40.5
  end
end
