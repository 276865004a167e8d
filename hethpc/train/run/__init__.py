"""The run itself: started, stepped, its epochs ended, checkpointed and finished."""
