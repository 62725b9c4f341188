#!/usr/bin/env Rscript
# google/rappor's own decoder (Decode() of analysis/R/decode.R, as tests/compare_dist.R
# calls it: default alpha and correction) on case directories written by
# bench/rappor_client_data.py.
#
#   Rscript bench/rappor_reference_decode.R RAPPOR_CHECKOUT CASE_DIR...
#
# Writes CASE_DIR/r_results.csv (Decode()'s fit) and CASE_DIR/r_metrics.json
# (its metrics and the seconds Decode() took, as compare_dist.R times it).
#
# limSolve (needed by analysis/R/alternative.R) is not packaged for Debian. If it is not
# installed, a stand-in with its one function used there is installed in a temporary
# library: lsei(A, B, G, H, type = 2) is limSolve's quadprog path, i.e. minimise
# ||A x - B||^2 subject to G x >= H with quadprog::solve.QP on Dmat = A'A + 1e-8 I,
# dvec = A'B, and entries below sqrt(machine eps) in absolute value set to 0.

args <- commandArgs(TRUE)
if (length(args) < 2) {
  cat("usage: rappor_reference_decode.R RAPPOR_CHECKOUT CASE_DIR...\n")
  quit(status = 2)
}
root <- normalizePath(args[[1]])
cases <- args[-1]

if (!requireNamespace("limSolve", quietly = TRUE)) {
  lib <- file.path(tempdir(), "lib")
  pkg <- file.path(tempdir(), "limSolve")
  dir.create(lib)
  dir.create(file.path(pkg, "R"), recursive = TRUE)
  writeLines(c("Package: limSolve", "Version: 0.0.1",
               "Title: lsei(type = 2) stand-in for google/rappor's decoder",
               "Description: Stand-in.", "License: Apache-2.0", "Imports: quadprog"),
             file.path(pkg, "DESCRIPTION"))
  writeLines("export(lsei)", file.path(pkg, "NAMESPACE"))
  writeLines(c(
    "lsei <- function(A, B, G, H, type = 2, tol = sqrt(.Machine$double.eps)) {",
    "  stopifnot(type == 2)",
    "  A <- as.matrix(A); G <- as.matrix(G)",
    "  dmat <- crossprod(A, A); diag(dmat) <- diag(dmat) + 1e-8",
    "  x <- quadprog::solve.QP(dmat, crossprod(A, as.vector(B)), t(G), as.vector(H))$solution",
    "  x[abs(x) < tol] <- 0",
    "  names(x) <- colnames(A)",
    "  list(X = x)",
    "}"), file.path(pkg, "R", "lsei.R"))
  install.packages(pkg, lib = lib, repos = NULL, type = "source", quiet = TRUE)
  .libPaths(c(lib, .libPaths()))
  cat("limSolve not installed: using the lsei(type = 2) stand-in\n")
}

Sys.setenv(RAPPOR_REPO = paste0(root, "/"))
source(file.path(root, "analysis/R/read_input.R"))
source(file.path(root, "analysis/R/decode.R"))
suppressPackageStartupMessages(library(jsonlite))
options(stringsAsFactors = FALSE)

for (dir in cases) {
  case <- fromJSON(file.path(dir, "case.json"))
  params <- ReadParameterFile(file.path(dir, "params.csv"))
  counts <- ReadCountsFile(file.path(dir, "counts.csv"), params)
  map <- ReadMapFile(file.path(dir, "map.csv"), params)
  set.seed(case$seed)  # Decode() resamples with rnorm
  timing <- system.time({
    res <- Decode(counts, map$map, params, quiet = TRUE)
  })
  write.csv(res$fit, file.path(dir, "r_results.csv"), row.names = FALSE)
  writeLines(toJSON(list(seconds = timing[["elapsed"]],
                         detected = nrow(res$fit),
                         allocated_mass = res$metrics$allocated_mass),
                    auto_unbox = TRUE),
             file.path(dir, "r_metrics.json"))
  cat(sprintf("%-48s R decode %.2f s, %d detected\n", basename(dir), timing[["elapsed"]],
              nrow(res$fit)))
}
