[
  inputs: ["{mix,.formatter}.exs", "{config,lib,test,bench,scripts}/**/*.{ex,exs}"]
]
