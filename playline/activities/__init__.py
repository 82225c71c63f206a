"""Everything with side effects: tool execution, receipts, the governor, the sheet, file I/O."""
