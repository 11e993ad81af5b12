def test_an_image_whose_kv_prefix_is_reused_is_not_encoded_again(
    model_dir: Path, tmp_path: Path, stock_server: ServerProcess
) -> None:
    """Every image of a request was looked up and, its features evicted, run through the tower
    again, even where the reused KV prefix already held all of its tokens (vllm-mlx's own prefix
    cache persistence has the same waste: images whose KV was reused were tower-encoded again)."""
    flags = ["--vision-cache-max-embedding-entries", "1"]  # a second image evicts the first's features
    chats = [Conversation() for _ in range(2)]
    with ServerProcess("visioncache", model_dir, tmp_path / "server", *flags) as server:
        chat_turn(server, chats, 0)  # chat 0's image, then chat 1's, whose features evict chat 0's
        recording = Recording(server)
        before = engine_stats(server)
        client = client_for(server.base_url)
        replies = [chat.send(client, "and what else is there") for chat in chats]  # history: one image each
        stats = engine_stats(server)
        tokens = recording.tokens()
        towers = recording.towers()
    assert towers == []  # neither history image ran through the tower: their KV was reused
    assert stats["kv_images_covered"] - before["kv_images_covered"] == 2
    assert stats["kv_tokens_reused"] > before["kv_tokens_reused"]
    stock_chats = [Conversation() for _ in range(2)]
    chat_turn(stock_server, stock_chats, 0)
    stock = Recording(stock_server)
    client = client_for(stock_server.base_url)
    assert [chat.send(client, "and what else is there") for chat in stock_chats] == replies
    assert stock.tokens() == tokens
