"""Dead-letter policy and the DLQ inspection and redrive tools."""
