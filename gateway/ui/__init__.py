"""`/admin/ui`: a static page that draws the live operator timeline, TTFTs, queues and batches."""
