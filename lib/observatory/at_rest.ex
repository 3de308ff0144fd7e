defmodule Observatory.AtRest do
  @moduledoc """
  Seals secrets kept in the data directory (the kill switch's webhook URLs: a
  Slack-style URL is its own credential) so that the directory's files, a backup or a
  copy of them, do not give them away.

  A sealed value is AES-256-GCM ciphertext with a random 96-bit IV, its tag, and the
  id of the key that sealed it, bound to what it belongs to (`aad`: the agent's id,
  so a sealed value copied onto another record does not open).

  ## The key

    * With a configured `:secret_key_base` (`OBSERVATORY_SECRET_KEY_BASE`), the key
      is derived from it (HMAC-SHA-256): it never touches the disk, a copy of the data
      directory alone opens nothing, and every node of a cluster — which must share
      the secret — opens the values the others sealed.
    * Without one (a single gateway, which then generates a throwaway secret at each
      start), the key is 32 random bytes in `at_rest.key` in the data directory
      (`Observatory.DataDirLock.dir/0`), created `0600` on first use and kept across
      restarts. It protects the values from anything that reads Mnesia's files but
      not that key file; configure a `:secret_key_base` for more.

  A value sealed under another key (the `:secret_key_base` changed) does not open:
  `unseal/2` says so, and the value must be entered again. Values that are not sealed
  (written by an older release) open as they are; `Observatory.KillSwitch.Agents`
  seals them at start.
  """

  @typedoc "A sealed value as stored."
  @type sealed :: {:sealed, 1, key_id :: binary(), iv :: binary(), binary(), tag :: binary()}

  @purpose "observatory at-rest key v1"
  @key_file "at_rest.key"

  @doc "Seals `plain`, bound to `aad`."
  @spec seal(binary(), binary()) :: sealed()
  def seal(plain, aad) when is_binary(plain) and is_binary(aad) do
    {key_id, key} = key()
    iv = :crypto.strong_rand_bytes(12)
    {ciphertext, tag} = :crypto.crypto_one_time_aead(:aes_256_gcm, key, iv, plain, aad, true)
    {:sealed, 1, key_id, iv, ciphertext, tag}
  end

  @doc """
  Opens a sealed value: `{:ok, plain}`, or `{:error, :other_key}` when another key
  sealed it, `{:error, :corrupt}` when it does not open. A plain binary (stored
  before sealing existed) is returned as it is.
  """
  @spec unseal(sealed() | binary(), binary()) :: {:ok, binary()} | {:error, :other_key | :corrupt}
  def unseal(plain, _aad) when is_binary(plain), do: {:ok, plain}

  def unseal({:sealed, 1, key_id, iv, ciphertext, tag}, aad) do
    case key() do
      {^key_id, key} ->
        case :crypto.crypto_one_time_aead(:aes_256_gcm, key, iv, ciphertext, aad, tag, false) do
          plain when is_binary(plain) -> {:ok, plain}
          :error -> {:error, :corrupt}
        end

      _other ->
        {:error, :other_key}
    end
  end

  def unseal(_other, _aad), do: {:error, :corrupt}

  @doc "Whether `value` is sealed (not a plain binary written by an older release)."
  @spec sealed?(term()) :: boolean()
  def sealed?(value), do: match?({:sealed, 1, _, _, _, _}, value)

  # `{key_id, key}`, built once per secret (or key file) and kept in :persistent_term.
  defp key do
    source = source()

    case :persistent_term.get({__MODULE__, :key}, nil) do
      {^source, key_id, key} ->
        {key_id, key}

      _ ->
        key = load(source)
        key_id = binary_part(:crypto.hash(:sha256, key), 0, 8)
        :persistent_term.put({__MODULE__, :key}, {source, key_id, key})
        {key_id, key}
    end
  end

  defp source do
    if Observatory.Application.secret_key_base_configured?(),
      do:
        {:secret_key_base,
         :crypto.hash(:sha256, Application.fetch_env!(:observatory, :secret_key_base))},
      else: {:file, Path.join(Observatory.DataDirLock.dir(), @key_file)}
  end

  defp load({:secret_key_base, _}),
    do:
      :crypto.mac(
        :hmac,
        :sha256,
        Application.fetch_env!(:observatory, :secret_key_base),
        @purpose
      )

  defp load({:file, path}) do
    case File.read(path) do
      {:ok, <<key::binary-size(32)>>} ->
        key

      {:ok, _other} ->
        raise "#{path} is not an at-rest key (32 bytes): move it away to have a new one made " <>
                "(values sealed with it will have to be entered again)"

      {:error, :enoent} ->
        create(path)
    end
  end

  # Written aside, then linked into place (which fails if the key exists): of two
  # gateways starting at once, one makes the key and the other reads the whole of it.
  defp create(path) do
    key = :crypto.strong_rand_bytes(32)
    File.mkdir_p!(Path.dirname(path))
    aside = "#{path}.#{System.unique_integer([:positive])}.new"

    try do
      File.touch!(aside)
      File.chmod!(aside, 0o600)
      File.write!(aside, key)

      case :file.make_link(aside, path) do
        :ok -> key
        {:error, :eexist} -> load({:file, path})
        {:error, reason} -> raise "cannot create #{path}: #{:file.format_error(reason)}"
      end
    after
      File.rm(aside)
    end
  end
end
