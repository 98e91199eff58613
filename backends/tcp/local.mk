# backends/tcp fragment
